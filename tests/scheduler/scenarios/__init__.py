import pytest

# The driver compares outcomes with `assert`: rewritten, a failing scenario shows what differs.
pytest.register_assert_rewrite("tests.scheduler.scenarios.driver")
