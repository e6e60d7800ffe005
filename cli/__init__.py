"""The typer command line (``treeprep``). Heavy imports (torch) happen inside the commands."""
