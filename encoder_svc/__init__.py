"""Encoder service: owns the image processor and the vision tower; answers Encode (next issue)."""
