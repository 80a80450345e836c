"""The in-process engine: placeholders, positions, sampling and the encode -> prefill -> decode loop."""
