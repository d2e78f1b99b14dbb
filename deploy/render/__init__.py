"""Floor 8: what a person reads: the run report, the status screen and the bench report (HTML)."""
