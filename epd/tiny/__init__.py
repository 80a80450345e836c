"""Generated checkpoints: `epd make-tiny-model` writes complete, randomly drawn model directories."""
