"""A stand-in for the expecttest package, which Debian does not package.

PyTorch's test harness (torch.testing._internal.common_utils) imports it
for two names: ACCEPT, whether to rewrite expected outputs, and TestCase,
the base of its own TestCase. The distributed suite compares no inline
expected outputs, so a plain unittest.TestCase serves.
"""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    longMessage = True
