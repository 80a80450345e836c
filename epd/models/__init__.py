"""Model families: adapters that split a transformers multimodal model into encoder and language roles."""
