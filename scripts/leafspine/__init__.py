"""The namespace leaf-spine lab behind scripts/netlab.py (its entry point and
import path: ``import netlab``; the module map is in its docstring)."""
