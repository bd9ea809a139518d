"""Adapters to other libraries (the module paths of dataset-rt 0.4.8)."""
