"""Importing the PyTorch modules where PyTorch is missing says what to do."""
import importlib
import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


@unittest.skipIf(importlib.util.find_spec("torch") is not None, "PyTorch is installed")
class TestWithoutTorch(unittest.TestCase):
    def test_modules_say_what_to_do(self):
        for name in ("arenaplan.torch", "arenaplan.compile"):
            sys.modules.pop(name, None)
            with self.assertRaises(ModuleNotFoundError) as cm:
                importlib.import_module(name)
            msg = str(cm.exception)
            self.assertEqual(cm.exception.name, "torch")
            for want in (name, "PyTorch", "pytorch.org", "arenaplan[torch]"):
                self.assertIn(want, msg)

    def test_library_binding_needs_no_torch(self):
        importlib.import_module("arenaplan._lib")


if __name__ == "__main__":
    unittest.main()
