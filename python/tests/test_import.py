"""Importing the PyTorch modules where PyTorch is missing says what to do."""
import importlib
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


class TestWithoutTorch(unittest.TestCase):
    def test_modules_say_what_to_do(self):
        names = ("arenaplan.torch", "arenaplan.compile")
        saved = {k: v for k, v in sys.modules.items() if k == "torch" or k.startswith("torch.") or k in names}
        try:
            for k in saved:
                del sys.modules[k]
            sys.modules["torch"] = None  # what an import of a missing torch meets
            for name in names:
                with self.assertRaises(ModuleNotFoundError) as cm:
                    importlib.import_module(name)
                msg = str(cm.exception)
                self.assertEqual(cm.exception.name, "torch")
                for want in (name, "PyTorch", "pytorch.org", "arenaplan[torch]"):
                    self.assertIn(want, msg)
        finally:
            sys.modules.pop("torch", None)
            for name in names:
                sys.modules.pop(name, None)
            sys.modules.update(saved)

    def test_library_binding_needs_no_torch(self):
        importlib.import_module("arenaplan._lib")


if __name__ == "__main__":
    unittest.main()
