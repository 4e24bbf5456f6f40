from tests.services.fixtures import api_key, loopback, server  # noqa: F401
