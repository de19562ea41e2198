"""The codec layer on its own (no Redis): the stored form of sealed payloads, what the tag
authenticates, key sources and their errors."""

from __future__ import annotations

import base64
import os

import pytest

import dueq
from dueq._wire.codec import (
    PayloadCodec,
    associated_data,
    keys_from_environment,
    logical_queue,
    sealed_info,
)
from dueq._wire.envelope import (
    TaskOptions,
    decode_named,
    encode_envelope,
    pack_task,
    repack_with_id,
)

pytest.importorskip("cryptography")
pytest.importorskip("zstandard")

K1 = os.urandom(32)
K2 = os.urandom(32)


def codec(compression: str | None = None, **keys: bytes) -> PayloadCodec:
    keys = keys or {"k1": K1}
    return PayloadCodec(dueq.Encrypted(keys=keys, active=list(keys)[-1]), compression)


def sealed(payload: object, c: PayloadCodec, task_id: str = "t1", queue: str = "q") -> bytes:
    return encode_envelope(payload, 10**6, codec=c, queue=queue, task_id=task_id)


def test_the_codec_line_follows_the_head_and_records_compression_and_key_id():
    c = codec("zstd")
    raw = encode_envelope(
        {"s": "x" * 500}, 10**6, TaskOptions(priority=3), codec=c, queue="q", task_id="t1"
    )
    assert raw.startswith(b"2:3|||\n%z|k1\n")
    info = sealed_info(raw[len(b"2:3|||\n") :])
    assert info is not None and info.compressed and info.key_id == "k1"
    assert decode_named(raw, c, "q", "t1")[:2] == ({"s": "x" * 500}, TaskOptions(priority=3))


def test_each_seal_draws_a_fresh_nonce():
    c = codec()
    assert sealed({"a": 1}, c) != sealed({"a": 1}, c)


@pytest.mark.parametrize(
    ("queue", "task_id"), [("q", "t2"), ("other", "t1"), ("q", "t1\x00"), ("q", "")]
)
def test_a_ciphertext_opens_only_as_the_task_and_queue_it_was_sealed_for(queue, task_id):
    c = codec()
    raw = sealed({"a": 1}, c)
    with pytest.raises(dueq.UndecryptableTask, match="authentication") as caught:
        decode_named(raw, c, queue, task_id)
    assert isinstance(caught.value, dueq.PayloadError) and caught.value.key_id == "k1"


def test_a_shard_opens_what_its_queue_sealed():
    c = codec()
    assert decode_named(sealed({"a": 1}, c, queue="emails"), c, "emails#3", "t1")[0] == {"a": 1}
    assert logical_queue("emails#3") == "emails" == logical_queue("emails#3.1")
    assert logical_queue("a#b") == "a#b" and logical_queue("#1") == "#1"


def test_the_codec_line_is_authenticated_too():
    c = codec()
    raw = sealed({"s": "x" * 500}, codec("zstd"))
    flipped = raw.replace(b"%z|k1\n", b"%|k1\n", 1)
    with pytest.raises(dueq.UndecryptableTask):
        decode_named(flipped, c, "q", "t1")


def test_a_flipped_ciphertext_bit_is_refused():
    c = codec()
    raw = bytearray(sealed({"a": 1}, c))
    raw[-1] ^= 1
    with pytest.raises(dueq.UndecryptableTask):
        decode_named(bytes(raw), c, "q", "t1")


def test_a_corrupt_compressed_payload_is_a_payload_error():
    raw = b"1:%z|\n\x28\xb5\x2f\xfdgarbage"
    with pytest.raises(dueq.PayloadError, match="compressed"):
        decode_named(raw)


def test_a_payload_that_does_not_shrink_is_stored_uncompressed():
    raw = encode_envelope({"a": 1}, 10**6, codec=PayloadCodec(None, "zstd"))
    assert raw == b'1:{"a":1}'


def test_a_generated_id_drawn_again_is_sealed_again_for_the_new_id():
    c = codec()
    record = pack_task(0, 0, "first", sealed({"a": 1}, c, task_id="first"), None, b"tail")
    again = repack_with_id(record, "second", c, "q")
    envelope = again[again.index(b"1:%") : -len(b"tail")]
    assert again.endswith(b"tail")
    assert decode_named(envelope, c, "q", "second")[0] == {"a": 1}
    with pytest.raises(dueq.UndecryptableTask):
        decode_named(envelope, c, "q", "first")


def hand_sealed(plaintext: bytes, c: PayloadCodec, head: bytes = b"1:") -> bytes:
    """An envelope whose payload is ``plaintext`` sealed as task t1 of queue q, whatever it
    holds (encode_envelope seals only JSON)."""
    line = b"%|k1\n"
    assert c.codec is not None
    return head + line + c.codec.seal(plaintext, line, associated_data("q", "t1"))


@pytest.mark.parametrize("head", [b"1:", b"1:~@send\n", b"2:3|||\n", b"1:~@b!d\n"])
def test_a_sealed_payload_is_read_the_same_after_any_head(head):
    c = codec()
    raw = hand_sealed(b'{"a":[1,2]}', c, head)
    if b"!" in head:  # an unreadable name is refused before the payload is opened
        with pytest.raises(dueq.PayloadError, match="name"):
            decode_named(raw, c, "q", "t1")
        return
    payload, _, _, name = decode_named(raw, c, "q", "t1")
    assert payload == {"a": [1, 2]} and name == ("send" if b"@" in head else None)
    with pytest.raises(dueq.UndecryptableTask, match="authentication"):
        decode_named(raw, c, "q", "t2")
    with pytest.raises(dueq.UndecryptableTask):  # no task id: an encrypted payload never opens
        decode_named(raw, c, "q")
    with pytest.raises(dueq.UndecryptableTask, match="no codec"):
        decode_named(raw, PayloadCodec(), "q", "t1")


@pytest.mark.parametrize(
    ("plaintext", "match"),
    [(b"{not json", "not valid JSON"), (b"\xff\xfe", "not valid JSON"), (b" [1] ", None)],
)
def test_an_opened_payload_is_read_as_json_loads_reads_it(plaintext, match):
    c = codec()
    raw = hand_sealed(plaintext, c)
    if match is None:
        assert decode_named(raw, c, "q", "t1")[0] == [1]
        return
    with pytest.raises(dueq.PayloadError, match=match):
        decode_named(raw, c, "q", "t1")


def test_an_opened_payload_nesting_too_deep_is_refused():
    c = codec()
    deep = b"[" * 200 + b"]" * 200
    with pytest.raises(dueq.PayloadError, match="nests deeper"):
        decode_named(hand_sealed(deep, c), c, "q", "t1")


@pytest.mark.parametrize(
    "body", [b"%x|k1\n" + b"\0" * 40, b"%|k1" + b"\0" * 100, b"%|k 1\n" + b"\0" * 40, b"%|k1\n"]
)
def test_an_unreadable_codec_line_or_a_short_ciphertext_is_refused(body):
    c = codec()
    with pytest.raises(dueq.PayloadError):
        decode_named(b"1:" + body, c, "q", "t1")


def test_a_key_id_the_codec_does_not_know_is_named_in_the_refusal():
    raw = sealed({"a": 1}, codec(k9=K2))
    with pytest.raises(dueq.UndecryptableTask, match="no key 'k9'") as caught:
        decode_named(raw, codec(), "q", "t1")
    assert caught.value.key_id == "k9"


def test_keys_must_be_32_bytes_and_the_active_one_listed():
    with pytest.raises(dueq.ConfigurationError, match="32 bytes"):
        dueq.Encrypted(keys={"k1": b"short"}, active="k1")
    with pytest.raises(dueq.ConfigurationError, match="not one of the keys"):
        dueq.Encrypted(keys={"k1": K1}, active="k2")
    with pytest.raises(dueq.ConfigurationError, match="active="):
        dueq.Encrypted(keys={"k1": K1, "k2": K2})
    with pytest.raises(dueq.ConfigurationError, match="key id"):
        dueq.Encrypted(keys={"k|1": K1})
    with pytest.raises(dueq.ConfigurationError, match="active="):
        dueq.Encrypted(keys=lambda key_id: K1)
    assert dueq.Encrypted(keys={"k1": K1}).active == "k1"


def test_the_repr_of_a_codec_names_key_ids_never_keys():
    shown = repr(dueq.Encrypted(keys={"k1": K1, "k2": K2}, active="k2"))
    assert "k1" in shown and "k2" in shown
    assert K1.hex() not in shown and base64.b64encode(K1).decode() not in shown


def test_dueq_keys_lists_ids_and_base64_keys_and_the_last_is_active_by_default(monkeypatch):
    listed = f"k1={base64.b64encode(K1).decode()}, k2={base64.urlsafe_b64encode(K2).decode()}"
    assert keys_from_environment({"DUEQ_KEYS": listed}) == ({"k1": K1, "k2": K2}, "k2")
    chosen = {"DUEQ_KEYS": listed, "DUEQ_ACTIVE_KEY": "k1"}
    assert keys_from_environment(chosen)[1] == "k1"
    monkeypatch.setenv("DUEQ_KEYS", listed)
    monkeypatch.setenv("DUEQ_ACTIVE_KEY", "k1")
    assert dueq.Encrypted().active == "k1"


@pytest.mark.parametrize(
    ("value", "match"),
    [("", "not set"), ("k1", "id=<base64 key>"), ("k1=!!!", "not base64"), ("k1=AAAA", "32 bytes")],
)
def test_a_malformed_dueq_keys_is_a_configuration_error_that_shows_no_key(value, match):
    with pytest.raises(dueq.ConfigurationError, match=match) as caught:
        keys_from_environment({"DUEQ_KEYS": value})
    assert "AAAA" not in str(caught.value)


def test_compression_and_codec_arguments_are_checked():
    with pytest.raises(dueq.ConfigurationError, match="compression"):
        PayloadCodec(None, "gzip")
    with pytest.raises(dueq.ConfigurationError, match="codec"):
        PayloadCodec("k1", None)  # type: ignore[arg-type]
