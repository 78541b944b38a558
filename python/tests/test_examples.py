"""The examples (python/examples) compile and use only what arenaplan.torch
exports; scripts/gpu-compat.sh runs them on a GPU (they need torch and a
device, which this suite does without)."""
import ast
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples")
PACKAGE = os.path.join(HERE, "..", "arenaplan")


def exported():
    """arenaplan.torch's __all__, read without importing torch."""
    with open(os.path.join(PACKAGE, "torch.py")) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("arenaplan/torch.py has no __all__")


class ExamplesTest(unittest.TestCase):
    def test_examples_use_the_public_surface(self):
        names = exported()
        files = sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py"))
        self.assertGreaterEqual(len(files), 3)
        for f in files:
            with open(os.path.join(EXAMPLES, f)) as fh:
                src = fh.read()
            tree = ast.parse(src, f)
            self.assertTrue(ast.get_docstring(tree), f"{f}: no docstring saying what it shows and how to run it")
            used = {n.attr for n in ast.walk(tree)
                    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "ap"}
            self.assertIn("install", used, f"{f}: never calls ap.install()")
            self.assertLessEqual(used, names, f"{f}: uses names arenaplan.torch does not export")


if __name__ == "__main__":
    unittest.main()
