"""Paper figures from DigenRL profile logs and results tables; see paper_figures/README.md."""
