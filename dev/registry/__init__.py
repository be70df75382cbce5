"""A local Apicurio schema registry from Maven Central: :mod:`dev.registry.registry`."""
