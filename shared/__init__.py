"""The template's Python package: the dedup module and the example order domain."""
