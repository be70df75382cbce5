"""Helpers shared by the tests: fakes of the edges, builders of messages and schemas, real servers.

Test modules import from here, never from one another (nor from a conftest).
"""
