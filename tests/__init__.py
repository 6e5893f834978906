"""Test suite of ckpt."""
