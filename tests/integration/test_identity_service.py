"""The test harness's identity service (harness.identity) answers like
Microsoft Entra ID, the instance metadata service and the App Service identity
endpoint, refuses like them, and its switches do what the tests of ces2pg's
Entra ID support rely on; a PostgreSQL role's password follows its tokens.
Every check here can fail: each answer is fetched over HTTP and each token
verified against the JWKS document the service publishes."""

import contextlib
import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

import jwt
import psycopg2
import pytest

from harness.identity import (CLIENT_ASSERTION_TYPE, DEFAULT_TENANT,
                              EVENTHUBS_AUDIENCE, EVENTHUBS_SCOPE,
                              FEDERATED_AUDIENCE, POSTGRES_AUDIENCE,
                              POSTGRES_SCOPE, entra_error)


def http(url, form=None, headers=None, timeout=10):
    """(status, JSON body or text) of a GET, or of a form POST."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw, ctype = r.status, r.read(), r.headers["Content-Type"]
    except urllib.error.HTTPError as e:
        status, raw, ctype = e.code, e.read(), e.headers["Content-Type"]
    return status, json.loads(raw) if ctype.startswith("application/json") \
        else raw.decode()


def secret_form(svc, scope=EVENTHUBS_SCOPE, **over):
    form = {"client_id": svc.client_id, "client_secret": svc.client_secret,
            "scope": scope, "grant_type": "client_credentials"}
    form.update(over)
    return {k: v for k, v in form.items() if v is not None}


def assertion_form(svc, assertion, scope=POSTGRES_SCOPE):
    return {"client_id": svc.federated_client_id, "scope": scope,
            "grant_type": "client_credentials",
            "client_assertion_type": CLIENT_ASSERTION_TYPE,
            "client_assertion": assertion}


def verified(svc, token, audience):
    """The token's claims, its signature checked with the key the JWKS
    document (found through the OpenID configuration) publishes."""
    status, config = http(svc.openid_configuration_url())
    assert status == 200, config
    key = jwt.PyJWKClient(config["jwks_uri"]).get_signing_key_from_jwt(token)
    return jwt.decode(token, key.key, algorithms=["RS256"], audience=audience)


def imds(svc, resource=EVENTHUBS_AUDIENCE, client_id=None, metadata=True,
         api_version="2018-02-01"):
    query = {"api-version": api_version, "resource": resource}
    if client_id:
        query["client_id"] = client_id
    return http(svc.imds_url + "?" + urllib.parse.urlencode(query),
                headers={"Metadata": "true"} if metadata else {})


def app_service(svc, resource=EVENTHUBS_AUDIENCE, client_id=None, header=True):
    query = {"api-version": "2019-08-01", "resource": resource}
    if client_id:
        query["client_id"] = client_id
    headers = {}
    if header is True:
        headers["X-IDENTITY-HEADER"] = svc.identity_header
    elif header:
        headers["X-IDENTITY-HEADER"] = header
    return http(svc.app_service_url + "?" + urllib.parse.urlencode(query),
                headers=headers)


def assert_entra_error(body, error, code):
    assert body["error"] == error, body
    assert body["error_codes"] == [code], body
    assert re.fullmatch(rf"AADSTS{code}: .+ Trace ID: [0-9a-f-]{{36}} "
                        rf"Correlation ID: [0-9a-f-]{{36}} Timestamp: "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ",
                        body["error_description"]), body
    assert body["trace_id"] in body["error_description"]


# --------------------------------------------------------------------------
# The v2.0 token endpoint


def test_client_secret_gets_a_token_for_the_scope(identity_service):
    svc = identity_service
    svc.set(lifetime=20)
    status, body = http(svc.token_url(), secret_form(svc))
    assert status == 200, body
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == body["ext_expires_in"] == 20
    claims = verified(svc, body["access_token"], EVENTHUBS_AUDIENCE)
    assert claims["exp"] - claims["iat"] == 20
    assert claims["iss"] == f"https://sts.windows.net/{DEFAULT_TENANT}/"
    assert claims["tid"] == DEFAULT_TENANT
    assert claims["appid"] == claims["azp"] == svc.client_id
    assert claims["sub"] == claims["oid"]
    # As long as Entra's tokens, which is what a password field must take.
    assert len(body["access_token"]) > 1000
    [issued] = svc.issued
    assert (issued.source, issued.audience, issued.exp, issued.token) == (
        "token", EVENTHUBS_AUDIENCE, claims["exp"], body["access_token"])
    assert svc.requests["token"] == 1


def test_wrong_client_secret_is_refused_like_entra(identity_service):
    svc = identity_service
    status, body = http(svc.token_url(), secret_form(
        svc, client_secret=svc.client_secret[:-1] + "x"))
    assert status == 401
    assert_entra_error(body, "invalid_client", 7000215)
    assert "Invalid client secret provided" in body["error_description"]
    assert svc.issued == []


def test_unknown_tenant_is_refused_like_entra(identity_service):
    svc = identity_service
    status, body = http(svc.token_url("no-such-tenant"), secret_form(svc))
    assert status == 400
    assert_entra_error(body, "invalid_request", 90002)
    assert "Tenant 'no-such-tenant' not found" in body["error_description"]


@pytest.mark.parametrize("over, status, error, code", [
    ({"client_id": "00000000-0000-0000-0000-000000000000"}, 400,
     "unauthorized_client", 700016),
    ({"scope": EVENTHUBS_AUDIENCE}, 400, "invalid_scope", 1002012),
    ({"grant_type": "password"}, 400, "unsupported_grant_type", 70003),
    ({"grant_type": None}, 400, "invalid_request", 900144),
    ({"client_secret": None}, 401, "invalid_client", 7000218),
])
def test_bad_requests_are_refused_like_entra(identity_service, over, status,
                                             error, code):
    svc = identity_service
    got, body = http(svc.token_url(), secret_form(svc, **over))
    assert got == status, body
    assert_entra_error(body, error, code)
    assert svc.issued == []


def test_federated_token_file_is_accepted_as_client_assertion(
        identity_service, tmp_path):
    svc = identity_service
    path = tmp_path / "azure-identity-token"
    svc.write_federated_token_file(path)
    status, body = http(svc.token_url(), assertion_form(svc, path.read_text()))
    assert status == 200, body
    claims = verified(svc, body["access_token"], POSTGRES_AUDIENCE)
    assert claims["appid"] == svc.federated_client_id
    # The file rotates: a new one is accepted too.
    first = path.read_text()
    svc.write_federated_token_file(path)
    assert path.read_text() != first
    status, body = http(svc.token_url(), assertion_form(svc, path.read_text()))
    assert status == 200, body


@pytest.mark.parametrize("kw, status, error, code", [
    ({"forged": True}, 401, "invalid_client", 700027),
    ({"lifetime": -600}, 400, "invalid_client", 700024),
    ({"subject": "system:serviceaccount:other:other"}, 400, "invalid_client",
     70021),
    ({"audience": "api://SomethingElse"}, 400, "invalid_client", 70021),
])
def test_bad_client_assertions_are_refused(identity_service, kw, status, error,
                                           code):
    svc = identity_service
    got, body = http(svc.token_url(),
                     assertion_form(svc, svc.federated_token(**kw)))
    assert got == status, body
    assert_entra_error(body, error, code)
    assert svc.issued == []


def test_a_federated_token_is_not_an_access_token(identity_service):
    svc = identity_service
    assertion = svc.federated_token()
    assert jwt.decode(assertion, options={"verify_signature": False})[
        "aud"] == [FEDERATED_AUDIENCE]
    # Signed by the cluster's key, which the JWKS document does not hold.
    kid = jwt.get_unverified_header(assertion)["kid"]
    assert kid not in [k["kid"] for k in http(svc.jwks_url)[1]["keys"]]
    with pytest.raises(jwt.InvalidSignatureError):
        svc.decode(assertion)


# --------------------------------------------------------------------------
# IMDS and App Service


def test_imds_answers_like_imds(identity_service):
    svc = identity_service
    svc.set(lifetime=20)
    status, body = imds(svc, POSTGRES_AUDIENCE)
    assert status == 200, body
    for field in ("expires_in", "expires_on", "ext_expires_in", "not_before"):
        assert isinstance(body[field], str) and body[field].isdigit(), body
    assert int(body["expires_in"]) in (19, 20)
    assert body["resource"] == POSTGRES_AUDIENCE
    assert body["token_type"] == "Bearer"
    assert body["client_id"] == svc.system_identity
    claims = verified(svc, body["access_token"], POSTGRES_AUDIENCE)
    assert str(claims["exp"]) == body["expires_on"]
    assert claims["appid"] == svc.system_identity
    # A user-assigned identity by its client id.
    status, body = imds(svc, client_id=svc.user_identity)
    assert status == 200, body
    assert verified(svc, body["access_token"], EVENTHUBS_AUDIENCE)[
        "appid"] == svc.user_identity
    assert [i.source for i in svc.issued] == ["imds", "imds"]


def test_imds_refuses_like_imds(identity_service):
    svc = identity_service
    status, body = imds(svc, metadata=False)
    assert (status, body["error"]) == (400, "invalid_request"), body
    assert "metadata header" in body["error_description"]
    status, body = imds(svc, client_id="00000000-0000-0000-0000-000000000000")
    assert (status, body) == (400, {"error": "invalid_request",
                                    "error_description": "Identity not found"})
    status, body = imds(svc, api_version="2017-09-01")
    assert status == 400 and "api-version" in body["error"], body
    assert svc.issued == []
    assert svc.requests["imds"] == 3


def test_app_service_endpoint_answers_and_refuses(identity_service):
    svc = identity_service
    status, body = app_service(svc)
    assert status == 200, body
    assert set(body) == {"access_token", "expires_on", "resource",
                         "token_type", "client_id"}
    claims = verified(svc, body["access_token"], EVENTHUBS_AUDIENCE)
    assert body["expires_on"] == str(claims["exp"])
    assert body["client_id"] == svc.system_identity
    status, body = app_service(svc, client_id=svc.user_identity)
    assert (status, body["client_id"]) == (200, svc.user_identity)
    assert app_service(svc, header=False)[0] == 401
    assert app_service(svc, header="not-the-header")[0] == 403
    status, body = app_service(svc, client_id="unknown")
    assert status == 400 and "No Managed Identity" in body["message"], body
    assert len(svc.issued) == 2


# --------------------------------------------------------------------------
# Tokens the broker must refuse


def test_forged_and_wrong_audience_tokens_do_not_verify(identity_service):
    svc = identity_service
    forged = svc.forge()
    assert jwt.get_unverified_header(forged)["kid"] == svc.kid
    with pytest.raises(jwt.InvalidSignatureError):
        verified(svc, forged, EVENTHUBS_AUDIENCE)
    other = svc.issue("https://other.servicebus.windows.net")
    with pytest.raises(jwt.InvalidAudienceError):
        verified(svc, other, EVENTHUBS_AUDIENCE)
    with pytest.raises(jwt.ExpiredSignatureError):
        verified(svc, svc.issue(lifetime=-60), EVENTHUBS_AUDIENCE)


# --------------------------------------------------------------------------
# Switches


def test_outage_answers_503_then_recovers(identity_service):
    svc = identity_service
    svc.set(outage=True)
    for get in (lambda: http(svc.token_url(), secret_form(svc)),
                lambda: imds(svc), lambda: app_service(svc)):
        status, body = get()
        assert (status, body["error"]) == (503, "temporarily_unavailable")
    assert svc.issued == []
    svc.set(outage=False)
    assert imds(svc)[0] == 200
    assert svc.requests == {"token": 1, "imds": 2, "app_service": 1}


def test_stopped_service_refuses_connections_on_the_same_port(identity_service):
    svc = identity_service
    port = svc.port
    svc.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), 2).close()
    svc.start()
    assert svc.port == port
    assert imds(svc)[0] == 200


def test_delay_slows_the_answers(identity_service):
    svc = identity_service
    svc.set(delay=1.5)
    started = time.monotonic()
    assert imds(svc)[0] == 200
    assert time.monotonic() - started >= 1.5
    # A client that gives up first gets nothing.
    with pytest.raises((socket.timeout, urllib.error.URLError)):
        imds_timeout = urllib.request.Request(
            svc.imds_url + "?api-version=2018-02-01&resource=x",
            headers={"Metadata": "true"})
        urllib.request.urlopen(imds_timeout, timeout=0.5)
    svc.set(delay=0)
    started = time.monotonic()
    assert imds(svc)[0] == 200
    assert time.monotonic() - started < 1.5


def test_forced_errors_answer_the_next_requests(identity_service):
    svc = identity_service
    svc.fail_next(*entra_error("invalid_client", 7000222,
                               "The provided client secret keys are expired.",
                               401), count=2)
    svc.fail_next(502, "<html><body>Bad Gateway</body></html>", endpoint="imds")
    for _ in range(2):
        status, body = http(svc.token_url(), secret_form(svc))
        assert status == 401
        assert_entra_error(body, "invalid_client", 7000222)
    status, body = imds(svc)
    assert (status, body) == (502, "<html><body>Bad Gateway</body></html>")
    assert svc.forced_left() == 0
    assert http(svc.token_url(), secret_form(svc))[0] == 200
    assert [i.source for i in svc.issued] == ["token"]


def test_hooks_see_each_token_and_a_failing_hook_withholds_it(identity_service):
    svc = identity_service
    seen = []
    svc.on_issue(lambda aud, token, exp: seen.append((aud, token, exp)))
    status, body = imds(svc, POSTGRES_AUDIENCE)
    assert status == 200
    [(aud, token, exp)] = seen
    assert (aud, token, str(exp)) == (POSTGRES_AUDIENCE, body["access_token"],
                                      body["expires_on"])

    def broken(aud, token, exp):
        raise RuntimeError("database down")

    svc.on_issue(broken)
    status, body = imds(svc)
    assert (status, body["error"]) == (500, "server_error"), body
    assert [str(e) for e in svc.hook_errors] == ["database down"]
    svc.remove_hook(broken)
    assert imds(svc)[0] == 200


def test_the_request_log_holds_no_secret(identity_service, tmp_path):
    svc = identity_service
    http(svc.token_url(), secret_form(svc))
    http(svc.token_url(), secret_form(svc, client_secret="wrong-secret-value"))
    http(svc.token_url(), assertion_form(svc, svc.federated_token()))
    imds(svc)
    app_service(svc)
    log = (tmp_path / "identity-service.log").read_text()
    assert len(log.splitlines()) == 5, log
    assert " token 401" in log and " imds 200" in log, log
    for secret in svc.secrets() + ["wrong-secret-value"]:
        assert secret not in log
    assert len(svc.secrets()) >= 5


# --------------------------------------------------------------------------
# PostgreSQL: the token is the password


def can_login(rotation, password):
    try:
        conn = psycopg2.connect(rotation.conninfo_for("postgres"),
                                password=password or "", connect_timeout=5,
                                passfile="/nonexistent")
    except psycopg2.OperationalError as e:
        assert ("password authentication failed" in str(e)
                or "no password supplied" in str(e)), e
        return False
    with contextlib.closing(conn):
        with conn.cursor() as cur:
            cur.execute("SELECT current_user, inet_server_addr() IS NOT NULL")
            assert cur.fetchone() == (rotation.role, True)  # over TCP
    return True


def test_postgres_role_password_follows_the_tokens(identity_service,
                                                   entra_pg_role, pg):
    svc = identity_service
    rotation = entra_pg_role()
    assert rotation.password is None
    assert not can_login(rotation, None)
    assert not can_login(rotation, "anything")

    status, body = http(svc.token_url(), secret_form(svc, scope=POSTGRES_SCOPE))
    assert status == 200, body
    first = body["access_token"]
    assert rotation.count == 1 and rotation.password == first
    assert can_login(rotation, first)

    # Tokens for another audience leave the password alone.
    imds(svc, EVENTHUBS_AUDIENCE)
    assert rotation.count == 1 and can_login(rotation, first)

    status, body = imds(svc, POSTGRES_AUDIENCE)
    second = body["access_token"]
    assert second != first and rotation.count == 2
    assert can_login(rotation, second)
    assert not can_login(rotation, first)

    # Other roles keep the cluster's trust.
    assert pg.sql("SELECT current_user") == [("postgres",)]
    # The ALTER ROLE statements did not leave the token in
    # pg_stat_statements.
    pg.sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    rows = pg.sql("SELECT query FROM pg_stat_statements")
    assert rows and not any(second in q or first in q for (q,) in rows)

    rotation.close()
    assert can_login(rotation, None)  # trust again, as before
