from treeprep.cli.app import main

main()
