"""A DSpark launch with a sampling feature SGLang's DSpark worker cannot serve exactly stops, naming the flag
(integration/startup.py runs this on SGLang's resolved arguments, right after its own DSPARK handling)."""
from types import SimpleNamespace

import pytest

from dspark.integration.startup import INEXACT_WITH_DSPARK, refuse_inexact_features
from dspark.models.errors import ConfigError


@pytest.mark.parametrize("field", INEXACT_WITH_DSPARK)
def test_each_inexact_feature_stops_the_launch_by_flag_name(field):
    with pytest.raises(ConfigError, match=f"--{field.replace('_', '-')} cannot be served exactly with DSpark"):
        refuse_inexact_features(SimpleNamespace(**{name: name == field for name in INEXACT_WITH_DSPARK}))


def test_a_launch_without_them_goes_on():
    refuse_inexact_features(SimpleNamespace(**{name: False for name in INEXACT_WITH_DSPARK}))


def test_the_fields_are_sglangs_own():
    from sglang.srt.server_args import ServerArgs

    assert all(hasattr(ServerArgs, field) for field in INEXACT_WITH_DSPARK)
