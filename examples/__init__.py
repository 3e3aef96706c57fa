"""Example plug-ins (docs/plugins.md): load them as ``use = "examples.docs_filter:DocsFilter"`` with the
repository on the Python path; tests/test_plugin_examples.py runs each on the local web's structured pages."""
