from tests.broker.conftest import client, start_broker  # noqa: F401  (the broker suite's fixtures)
