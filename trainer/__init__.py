"""treeprep.trainer: exact tree training of Hugging Face causal LMs (torch, pyarrow; never polars)."""
