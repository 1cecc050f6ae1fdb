"""The OAUTH listener of the test harness's Apache Kafka really checks the
identity service's tokens: a client with a valid token for the Event Hubs
audience produces and consumes, a forged token, a token for another audience
and an expired one are refused (and the broker's log says why), and a session
ends after connections.max.reauth.ms, so live connections need their token
again. Without these, a test of ces2pg's Entra ID support could pass against a
broker that validates nothing."""

import json
import re
import time
import urllib.parse
import urllib.request
import uuid

from confluent_kafka import Consumer, KafkaError, Producer

from harness.common import produce_all, wait_until
from harness.identity import EVENTHUBS_SCOPE
from harness.reports import tail_text

# The broker's session length here: short, so that the reauthentication test
# sees several sessions end within seconds.
KAFKA_OAUTH_REAUTH_MS = 4000


class TokenSource:
    """A confluent_kafka oauth_cb: each call gets a token from the identity
    service's v2.0 token endpoint with the client secret (as ces2pg does in
    its service principal mode)."""

    def __init__(self, svc):
        self.svc, self.calls = svc, 0

    def __call__(self, _config):
        self.calls += 1
        form = urllib.parse.urlencode({
            "client_id": self.svc.client_id,
            "client_secret": self.svc.client_secret,
            "scope": EVENTHUBS_SCOPE, "grant_type": "client_credentials"})
        with urllib.request.urlopen(self.svc.token_url(), form.encode(),
                                    timeout=10) as r:
            body = json.load(r)
        return body["access_token"], time.time() + body["expires_in"]


def oauth_client(kind, kafka, source, **extra):
    """(a kind (Producer, Consumer) of the OAUTH listener, the list of the
    errors it reports)."""
    errors = []
    conf = kafka.oauth_config(oauth_cb=source,
                              error_cb=lambda e: errors.append(e), **extra)
    return kind(conf), errors


def broker_log_since(kafka, start):
    return tail_text(kafka.broker_log, start)


def log_size(kafka):
    with open(kafka.broker_log, "rb") as f:
        return f.seek(0, 2)


def assert_refused(kafka, token, topic, why):
    """A producer presenting token delivers nothing: the broker answers
    invalid_token, and its log names why (a regular expression)."""
    start = log_size(kafka)
    producer, errors = oauth_client(
        Producer, kafka, lambda _c: (token, time.time() + 3600),
        **{"message.timeout.ms": 30000})
    delivered = []
    producer.produce(topic, b"must not arrive",
                     on_delivery=lambda err, msg: delivered.append(err))

    def refused():
        producer.poll(0.2)
        return [e for e in errors if e.code() == KafkaError._AUTHENTICATION]

    [first, *_] = wait_until(refused, 30, message=lambda: f"an authentication "
                             f"error; client errors: {errors}")
    assert "invalid_token" in first.str(), first.str()
    assert delivered == []
    producer.purge()
    producer.flush(5)
    wait_until(lambda: re.search(why, broker_log_since(kafka, start)), 10,
               message=lambda: f"/{why}/ in the broker log:\n"
               + broker_log_since(kafka, start)[-3000:])


def consume(consumer, count, errors, timeout=60):
    got = []

    def all_in():
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
        return len(got) >= count

    wait_until(all_in, timeout, interval=0,
               message=lambda: f"{count} messages, got {len(got)}; client "
               f"errors: {errors}")
    return got


def test_valid_token_produces_and_consumes(kafka_oauth_logs, identity_service):
    kafka_oauth = kafka_oauth_logs
    svc = identity_service
    topic = kafka_oauth.create_topic(f"oauth-valid-{uuid.uuid4().hex[:8]}", 2)
    source = TokenSource(svc)
    producer, _ = oauth_client(Producer, kafka_oauth, source,
                               **{"enable.idempotence": True, "acks": "all"})
    values = [f"entra-{i}".encode() for i in range(20)]
    produce_all(producer, topic, values, [i % 2 for i in range(20)])
    consumer, errors = oauth_client(Consumer, kafka_oauth, TokenSource(svc), **{
        "group.id": f"oauth-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        assert sorted(consume(consumer, 20, errors)) == sorted(values)
    finally:
        consumer.close()
    # Each client got its token from the identity service's endpoint.
    assert source.calls >= 1
    assert svc.requests["token"] >= 2
    assert {i.audience for i in svc.issued} == {kafka_oauth.oauth_audience}


def test_forged_token_is_refused(kafka_oauth_logs, identity_service):
    kafka_oauth = kafka_oauth_logs
    topic = kafka_oauth.create_topic(f"oauth-forged-{uuid.uuid4().hex[:8]}", 1)
    assert_refused(kafka_oauth, identity_service.forge(), topic,
                   r"invalid signature|[Ss]ignature.*(invalid|failed|verif)")


def test_token_for_another_audience_is_refused(kafka_oauth_logs, identity_service):
    kafka_oauth = kafka_oauth_logs
    topic = kafka_oauth.create_topic(f"oauth-aud-{uuid.uuid4().hex[:8]}", 1)
    token = identity_service.issue("https://other-namespace.servicebus."
                                   "windows.net")
    assert_refused(kafka_oauth, token, topic,
                   r"Audience \(aud\) claim \[https://other-namespace\."
                   r"servicebus\.windows\.net\] doesn't contain an acceptable")


def test_expired_token_is_refused(kafka_oauth_logs, identity_service):
    kafka_oauth = kafka_oauth_logs
    topic = kafka_oauth.create_topic(f"oauth-exp-{uuid.uuid4().hex[:8]}", 1)
    # Past the broker's 30 s clock skew allowance.
    token = identity_service.issue(lifetime=-120)
    assert_refused(kafka_oauth, token, topic, r"[Ee]xpir")


def test_sessions_end_after_reauth_ms(kafka_oauth_logs, identity_service):
    kafka_oauth = kafka_oauth_logs
    """librdkafka 2.0 does not reauthenticate (KIP-368 came in 2.2): the
    broker closes its connections once the session (KAFKA_OAUTH_REAUTH_MS)
    is over, and the client connects again with the token it has. The
    SASL_SSL listener's PLAIN sessions, on the same broker, do not end."""
    assert kafka_oauth.oauth_reauth_ms == KAFKA_OAUTH_REAUTH_MS
    topic = kafka_oauth.create_topic(f"oauth-reauth-{uuid.uuid4().hex[:8]}", 1)
    stats = {"oauth": {}, "plain": {}}

    def keep(name):
        # The connections' counts, summed over librdkafka's brokers (the
        # bootstrap one, the node, the group coordinator).
        def cb(text):
            brokers = json.loads(text)["brokers"].values()
            stats[name] = {
                "connects": sum(b.get("connects", 0) for b in brokers),
                "disconnects": sum(b.get("disconnects", 0) for b in brokers),
                "brokers": {b["name"]: (b["state"], b.get("connects"),
                                        b.get("disconnects"))
                            for b in brokers}}
        return cb

    common = {"auto.offset.reset": "earliest", "enable.auto.commit": False,
              "statistics.interval.ms": 500, "fetch.wait.max.ms": 100}
    oauth, oauth_errors = oauth_client(
        Consumer, kafka_oauth, TokenSource(identity_service), **common,
        **{"group.id": "reauth-oauth", "stats_cb": keep("oauth")})
    plain_errors = []
    plain = Consumer(dict(kafka_oauth.sasl_config(), **common, **{
        "group.id": "reauth-plain", "stats_cb": keep("plain"),
        "error_cb": lambda e: plain_errors.append(e)}))
    try:
        oauth.subscribe([topic])
        plain.subscribe([topic])
        produce_all(kafka_oauth.producer(), topic, [b"before"])
        assert consume(oauth, 1, oauth_errors) == [b"before"]
        assert consume(plain, 1, plain_errors) == [b"before"]
        started = time.monotonic()

        def two_sessions_ended():
            oauth.poll(0.1)
            plain.poll(0.1)
            return stats["oauth"].get("disconnects", 0) >= 2

        wait_until(two_sessions_ended, 60, interval=0,
                   message=lambda: f"two OAUTH sessions to end: {stats}")
        # Not before the sessions' length, and the client went on.
        assert time.monotonic() - started >= KAFKA_OAUTH_REAUTH_MS / 1000 * 0.5
        produce_all(kafka_oauth.producer(), topic, [b"after"])
        assert consume(oauth, 1, oauth_errors) == [b"after"]
        assert consume(plain, 1, plain_errors) == [b"after"]
        assert stats["plain"].get("disconnects") == 0, stats["plain"]
        assert stats["oauth"]["connects"] >= 3, stats["oauth"]
    finally:
        oauth.close()
        plain.close()
