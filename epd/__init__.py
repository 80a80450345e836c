"""EPD cluster: shared core."""
