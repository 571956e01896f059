"""The run spec: its one declaration (model), the loader, the JSON Schema and the template."""
