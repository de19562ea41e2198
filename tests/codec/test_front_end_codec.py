"""``configured_codec`` and ``environment_codec``: the one rule by which the CLI, the Django
backend and the Spark writers build a queue's codec from their settings, and an ``Encrypted``
that pickles (a Spark plan carries it to the executors)."""

from __future__ import annotations

import base64
import pickle

import pytest

import dueq
from dueq._wire.codec import PayloadCodec, configured_codec, environment_codec

pytest.importorskip("cryptography")

# fixed keys: the parameters below hold them, and every xdist worker must collect the same ids
K1 = bytes(range(32))
K2 = bytes(range(32, 64))
LISTED = f"k1={base64.b64encode(K1).decode()},k2={base64.b64encode(K2).decode()}"


def opens(codec: dueq.Encrypted, sealed_by: dueq.Encrypted) -> bool:
    body = PayloadCodec(sealed_by).seal(b'{"n":1}', "q", "t")
    return PayloadCodec(codec).open(body, "q", "t") == b'{"n":1}'


def test_no_keys_means_no_codec():
    assert configured_codec(None) is None
    assert configured_codec("  ") is None
    assert environment_codec({}) is None


def test_a_keys_text_lists_the_keys_and_the_last_is_active_unless_named():
    made = configured_codec(LISTED)
    assert made is not None and made.active == "k2"
    chosen = configured_codec(LISTED, "k1")
    assert chosen is not None and chosen.active == "k1"
    assert opens(made, dueq.Encrypted(keys={"k1": K1}))


def test_the_environment_gives_dueq_keys_and_dueq_active_key():
    made = environment_codec({"DUEQ_KEYS": LISTED, "DUEQ_ACTIVE_KEY": "k1"})
    assert made is not None and made.active == "k1"


def test_an_encrypted_is_used_as_it_is():
    given = dueq.Encrypted(keys={"k1": K1})
    assert configured_codec(given) is given


@pytest.mark.parametrize(
    ("keys", "active", "message"),
    [
        (None, "k1", "an active key ('k1') is set but spark.x lists none"),
        ("k1=***", None, "spark.x key 'k1' is not base64"),
        ("k1", None, "spark.x entry 0 is not id=<base64 key>"),
        (LISTED, "k3", "active key 'k3' is not one of the keys given"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting_and_never_a_key(keys, active, message):
    with pytest.raises(dueq.ConfigurationError) as caught:
        configured_codec(keys, active, where="spark.x")
    assert message in str(caught.value)
    assert base64.b64encode(K1).decode() not in str(caught.value)


def test_an_encrypted_pickles_with_its_keys_and_opens_what_it_sealed():
    original = dueq.Encrypted(keys={"k1": K1, "k2": K2}, active="k2")
    copy = pickle.loads(pickle.dumps(original))
    assert copy.active == "k2" and opens(copy, original) and opens(original, copy)
