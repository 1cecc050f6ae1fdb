"""A local identity service for the tests of ces2pg's Microsoft Entra ID
support: it answers like the Entra ID v2.0 token endpoint, the instance
metadata service (IMDS) and the App Service identity endpoint, on 127.0.0.1,
and signs RS256 tokens that Apache Kafka (harness.realkafka's OAUTH listener)
checks against its JWKS document.

    svc = IdentityService().start()
    svc.token_url()            POST, form-encoded: client credentials with
                               client_secret or client_assertion
    svc.imds_url               GET ?api-version=2018-02-01&resource=R
                               [&client_id=C], header "Metadata: true"
    svc.app_service_url        GET ?api-version=2019-08-01&resource=R
                               [&client_id=C], header X-IDENTITY-HEADER
    svc.jwks_url               the signing key (what the broker trusts)

The switches (set(lifetime=, delay=, outage=), fail_next, stop/start) may be
changed from the test at any time, from any thread. rotate_postgres_role()
makes a PostgreSQL role's password follow the tokens for PostgreSQL's
audience, as on Azure Database for PostgreSQL, where the token is the password.
The service logs one line per request to log_path (when given), no secret.
"""

import base64
import contextlib
import json
import os
import secrets
import threading
import time
import uuid
from collections import Counter, namedtuple
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jwt
import psycopg2
from cryptography.hazmat.primitives.asymmetric import rsa
from psycopg2 import sql

DEFAULT_TENANT = "c0ffee00-ce52-4e57-8000-000000000043"
EVENTHUBS_AUDIENCE = "https://ces2pg-test.servicebus.windows.net"
EVENTHUBS_SCOPE = EVENTHUBS_AUDIENCE + "/.default"
POSTGRES_AUDIENCE = "https://ossrdbms-aad.database.windows.net"
POSTGRES_SCOPE = POSTGRES_AUDIENCE + "/.default"
FEDERATED_AUDIENCE = "api://AzureADTokenExchange"
CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
KUBERNETES_ISSUER = ("https://oidc.prod-aks.azure.com/" + DEFAULT_TENANT
                     + "/ces2pg-test/")
FEDERATED_SUBJECT = "system:serviceaccount:ces2pg:ces2pg"
IMDS_PATH = "/metadata/identity/oauth2/token"
IMDS_API_VERSION = "2018-02-01"
APP_SERVICE_PATH = "/msi/token"
APP_SERVICE_API_VERSION = "2019-08-01"
JWKS_PATH = "/keys"

# The endpoints that hand out tokens: the switches (delay, outage, fail_next)
# apply to these, never to the JWKS document the broker reads.
TOKEN_ENDPOINTS = ("token", "imds", "app_service")

# One token handed out: source is "token", "imds", "app_service" or "direct"
# (issue() called by the test); iat and exp are epoch seconds.
Issued = namedtuple("Issued", "source audience client_id tenant iat exp token")


def _b64url_uint(value):
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _new_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _stamp(when=None):
    when = datetime.fromtimestamp(when or time.time(), timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%SZ")


def entra_error(error, code, message, status=400):
    """(status, body) of an Entra ID error answer: error ("invalid_client"),
    the AADSTS code (7000215) and its message, with the trace and correlation
    ids and timestamp Entra adds. For fail_next(*entra_error(...))."""
    trace, correlation, stamp = str(uuid.uuid4()), str(uuid.uuid4()), _stamp()
    return status, {
        "error": error,
        "error_description": f"AADSTS{code}: {message} Trace ID: {trace} "
                             f"Correlation ID: {correlation} Timestamp: {stamp}",
        "error_codes": [code],
        "timestamp": stamp,
        "trace_id": trace,
        "correlation_id": correlation,
        "error_uri": f"https://login.microsoftonline.com/error?code={code}",
    }


def invalid_secret_error(client_id):
    return entra_error(
        "invalid_client", 7000215,
        "Invalid client secret provided. Ensure the secret being sent in the "
        "request is the client secret value, not the client secret ID, for a "
        f"secret added to app '{client_id}'.", 401)


def unknown_tenant_error(tenant):
    return entra_error(
        "invalid_request", 90002,
        f"Tenant '{tenant}' not found. Check to make sure you have the correct "
        "tenant ID and are signing into the correct cloud. Check with your "
        "subscription administrator, this may happen if there are no active "
        "subscriptions for the tenant.", 400)


def missing_parameter_error(name):
    return entra_error("invalid_request", 900144,
                       "The request body must contain the following "
                       f"parameter: '{name}'.", 400)


def identity_config(svc, source="managed_identity", timeout_ms=2000, **keys):
    """The identity section of a ces2pg configuration using svc: source is the
    identity.source value; keys are more identity.* keys (strings quoted). A
    managed identity gets svc's IMDS address unless keys name another; the
    v2.0 sources svc's tenant and authority host."""
    if source == "managed_identity":
        keys.setdefault("imds_endpoint", svc.imds_url)
    if source in ("client_secret", "workload_identity"):
        keys.setdefault("tenant_id", svc.tenant)
        keys.setdefault("authority_host", svc.authority_host)
    lines = [f'  source = "{source}";', f"  timeout_ms = {int(timeout_ms)};"]
    for key, value in keys.items():
        value = json.dumps(str(value)) if isinstance(value, (str, Path)) else value
        lines.append(f"  {key} = {value};")
    return "identity = {\n" + "\n".join(lines) + "\n};\n"


class _Refused(Exception):
    """An error answer: status and body (a dict, sent as JSON)."""

    def __init__(self, status, body):
        super().__init__(status)
        self.status, self.body = status, body


class HookError(Exception):
    """An on_issue hook failed: the token was not handed out."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request a connection, so that stop() leaves no
    # kept-alive connection a client could still use.
    server_version = "ces2pg-test-identity/1"

    def do_GET(self):
        self.server.service._handle(self, "GET")

    def do_POST(self):
        self.server.service._handle(self, "POST")

    def log_message(self, fmt, *args):
        pass  # the service writes its own log, without secrets


class IdentityService:
    """Entra ID, IMDS and App Service identity endpoints in one HTTP server on
    127.0.0.1 (see the module's comment). Registered from the start:

    tenant             DEFAULT_TENANT
    client_id, client_secret
                       a service principal with a client secret
    federated_client_id
                       an app that accepts federated assertions
                       (federated_token(), write_federated_token_file())
    system_identity    the client id of the system-assigned managed identity
    user_identity      the client id of a user-assigned managed identity
    identity_header    the App Service endpoint's X-IDENTITY-HEADER value

    What the tests assert on (reset() empties them):
    requests           Counter of requests by endpoint: "token", "imds",
                       "app_service", "jwks", "openid", "unknown"
    issued             list of Issued (source, audience, client_id, tenant,
                       iat, exp, token), in order
    refusals           list of (endpoint, status, body) of the error answers
    hook_errors        exceptions raised by on_issue hooks
    """

    def __init__(self, port=0, log_path=None, tenant=DEFAULT_TENANT):
        self._lock = threading.Lock()
        self._hook_lock = threading.Lock()  # one issuance and its hooks at a time
        self._key, self._forger, self._k8s_key = _new_key(), _new_key(), _new_key()
        self.kid = "ces2pg-test-" + secrets.token_hex(4)
        self.tenant = tenant
        self._tenants = {tenant}
        self._clients = {}  # client id -> {"tenant", "secret", "subjects"}
        self._managed = {}  # client id -> object id
        self.client_id, self.client_secret = self.add_client()
        self.federated_client_id = self.add_federated_client()
        self.system_identity = self.add_managed_identity(system=True)
        self.user_identity = self.add_managed_identity()
        self.identity_header = secrets.token_hex(16)
        self.port = port
        self._server = self._thread = None
        self._run_stopped = threading.Event()
        self.log_path = Path(log_path) if log_path else None
        self.reset()

    # Running

    def start(self):
        """Listens (again: on the same port after stop()); returns self."""
        with self._lock:
            if self._server is not None:
                return self
            self._server = _Server(("127.0.0.1", self.port), _Handler)
            self._server.service = self
            self.port = self._server.server_address[1]
            self._run_stopped = threading.Event()
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                name=f"identity-service-{self.port}", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        """Closes the listening socket: connections are refused until
        start(). A request waiting in its delay is dropped unanswered."""
        with self._lock:
            server, thread, self._server = self._server, self._thread, None
            self._run_stopped.set()
        if server is not None:
            server.shutdown()
            server.server_close()
            thread.join(10)

    def reset(self, log_path=None):
        """Back to the defaults: lifetime 3600 s, no delay, no outage, no
        forced errors, no hooks; counters and logs emptied; listening (if it
        was started). Registrations stay. log_path: a new request log."""
        with self._lock:
            self.lifetime = 3600
            self.delay = 0.0
            self.outage = False
            self._forced = []
            self._hooks = []
            self.requests = Counter()
            self.issued = []
            self.hook_errors = []
            self.refusals = []
            self._assertions = []
            if log_path is not None:
                self.log_path = Path(log_path)
            started = self._thread is not None
        if started:
            self.start()

    # Addresses

    @property
    def base_url(self):
        """http://127.0.0.1:PORT: the authority host (AZURE_AUTHORITY_HOST),
        and the IMDS and App Service address."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def authority_host(self):
        return self.base_url + "/"

    def token_url(self, tenant=None):
        """The tenant's v2.0 token endpoint."""
        return f"{self.base_url}/{tenant or self.tenant}/oauth2/v2.0/token"

    @property
    def imds_url(self):
        return self.base_url + IMDS_PATH

    @property
    def app_service_url(self):
        """IDENTITY_ENDPOINT of an App Service (with identity_header)."""
        return self.base_url + APP_SERVICE_PATH

    @property
    def jwks_url(self):
        return self.base_url + JWKS_PATH

    def openid_configuration_url(self, tenant=None):
        return (f"{self.base_url}/{tenant or self.tenant}"
                "/v2.0/.well-known/openid-configuration")

    # Registrations

    def add_tenant(self, tenant=None):
        tenant = tenant or str(uuid.uuid4())
        with self._lock:
            self._tenants.add(tenant)
        return tenant

    def add_client(self, client_id=None, secret=None, tenant=None):
        """Registers an app with a client secret; returns (client_id, secret)."""
        client_id = client_id or str(uuid.uuid4())
        secret = secret or ("Q~" + secrets.token_urlsafe(30))
        with self._lock:
            self._clients[client_id] = {"tenant": tenant or self.tenant,
                                        "secret": secret, "subjects": set()}
        return client_id, secret

    def add_federated_client(self, client_id=None, subject=FEDERATED_SUBJECT,
                             tenant=None):
        """Registers an app whose federated credential accepts assertions of
        KUBERNETES_ISSUER for subject; returns its client id."""
        client_id = client_id or str(uuid.uuid4())
        with self._lock:
            entry = self._clients.setdefault(
                client_id, {"tenant": tenant or self.tenant, "secret": None,
                            "subjects": set()})
            entry["subjects"].add(subject)
        return client_id

    def add_managed_identity(self, client_id=None, system=False):
        """Registers a managed identity (IMDS and App Service); system=True
        makes it the one answered when no client_id is asked for."""
        client_id = client_id or str(uuid.uuid4())
        with self._lock:
            self._managed[client_id] = str(uuid.uuid5(uuid.NAMESPACE_URL,
                                                      "mi:" + client_id))
            if system:
                self.system_identity = client_id
        return client_id

    # Switches

    def set(self, lifetime=None, delay=None, outage=None):
        """Sets any of the switches at once: lifetime (seconds of the tokens
        issued from now on), delay (seconds before each token endpoint
        answers), outage (True: the token endpoints answer 503
        temporarily_unavailable)."""
        with self._lock:
            if lifetime is not None:
                self.lifetime = int(lifetime)
            if delay is not None:
                self.delay = float(delay)
            if outage is not None:
                self.outage = bool(outage)

    def fail_next(self, status, body, count=1, endpoint=None):
        """The next count requests to the token endpoints (or to the one named:
        "token", "imds", "app_service") get this answer: body a dict (JSON) or
        str (sent as text/html, like a proxy's error page). Queued behind
        earlier ones."""
        if endpoint is not None and endpoint not in TOKEN_ENDPOINTS:
            raise ValueError(f"not a token endpoint: {endpoint}")
        with self._lock:
            self._forced.append([endpoint, status, body, count])

    def forced_left(self):
        """How many forced answers are still queued."""
        with self._lock:
            return sum(f[3] for f in self._forced)

    # Tokens

    def on_issue(self, hook):
        """hook(audience, token, exp) runs for every token issued, before it
        is answered (serialized: one issuance at a time). If it raises, the
        endpoint answers 500 and the error is kept in hook_errors. Returns
        hook, for remove_hook()."""
        with self._lock:
            self._hooks.append(hook)
        return hook

    def remove_hook(self, hook):
        with self._lock:
            self._hooks = [h for h in self._hooks if h is not hook]

    def _claims(self, audience, client_id, tenant, lifetime, extra):
        now = int(time.time())
        oid = self._managed.get(client_id) or str(
            uuid.uuid5(uuid.NAMESPACE_URL, "sp:" + (client_id or "")))
        claims = {
            "aud": audience, "iss": f"https://sts.windows.net/{tenant}/",
            "iat": now, "nbf": now, "exp": now + lifetime,
            # What Entra adds and clients must pass through untouched; it
            # also makes the tokens as long as Entra's (about 1.5 KB).
            "aio": base64.b64encode(os.urandom(96)).decode(),
            "appid": client_id, "azp": client_id, "appidacr": "2",
            "idp": f"https://sts.windows.net/{tenant}/",
            "oid": oid, "sub": oid, "tid": tenant,
            "rh": base64.urlsafe_b64encode(os.urandom(48)).decode(),
            "uti": secrets.token_urlsafe(16), "ver": "1.0",
            "xms_mirid": f"/subscriptions/{uuid.uuid4()}/resourcegroups/ces2pg-"
                         "test/providers/Microsoft.ManagedIdentity/"
                         f"userAssignedIdentities/ces2pg-{client_id}",
        }
        claims.update(extra)
        return claims

    def _sign(self, claims, key, kid):
        return jwt.encode(claims, key, algorithm="RS256",
                          headers={"kid": kid, "typ": "JWT"})

    def issue(self, audience=EVENTHUBS_AUDIENCE, client_id=None, lifetime=None,
              tenant=None, source="direct", **claims):
        """A valid token for audience (logged in issued, hooks run; a hook's
        failure raises HookError). lifetime in seconds (default: the
        switch; negative: already expired); claims override the defaults."""
        with self._lock:
            lifetime = self.lifetime if lifetime is None else int(lifetime)
            hooks = list(self._hooks)
        client_id = client_id or self.client_id
        tenant = tenant or self.tenant
        body = self._claims(audience, client_id, tenant, lifetime, claims)
        with self._hook_lock:
            token = self._sign(body, self._key, self.kid)
            with self._lock:
                self.issued.append(Issued(source, audience, client_id, tenant,
                                          body["iat"], body["exp"], token))
            for hook in hooks:
                try:
                    hook(audience, token, body["exp"])
                except Exception as e:  # answered as a 500 by the endpoints
                    with self._lock:
                        self.hook_errors.append(e)
                    raise HookError(f"on_issue hook {hook!r}: {e}") from e
        return token

    def forge(self, audience=EVENTHUBS_AUDIENCE, client_id=None, lifetime=None,
              kid=None, **claims):
        """A token like issue()'s but signed by an unrelated key, under the
        real key's kid unless kid is given. Not logged, no hooks."""
        lifetime = self.lifetime if lifetime is None else int(lifetime)
        body = self._claims(audience, client_id or self.client_id, self.tenant,
                            lifetime, claims)
        return self._sign(body, self._forger, kid or self.kid)

    def decode(self, token, audience=None):
        """The claims of a token this service signed (jwt errors otherwise);
        the audience is checked when given."""
        return jwt.decode(token, self._key.public_key(), algorithms=["RS256"],
                          audience=audience,
                          options={"verify_aud": audience is not None})

    def jwks(self):
        numbers = self._key.public_key().public_numbers()
        return {"keys": [{"kty": "RSA", "use": "sig", "kid": self.kid,
                          "alg": "RS256", "n": _b64url_uint(numbers.n),
                          "e": _b64url_uint(numbers.e)}]}

    def federated_token(self, subject=FEDERATED_SUBJECT, lifetime=3600,
                        audience=FEDERATED_AUDIENCE, issuer=KUBERNETES_ISSUER,
                        forged=False):
        """A service account token as AKS projects it into
        AZURE_FEDERATED_TOKEN_FILE, signed by the cluster's key (forged: by an
        unrelated one). The token endpoint accepts it as client_assertion
        for federated_client_id."""
        now = int(time.time())
        body = {"aud": [audience], "iss": issuer, "sub": subject, "iat": now,
                "nbf": now, "exp": now + int(lifetime), "jti": str(uuid.uuid4()),
                "kubernetes.io": {"namespace": subject.split(":")[2]
                                  if subject.count(":") >= 3 else "default"}}
        token = self._sign(body, self._forger if forged else self._k8s_key,
                           "kubernetes-" + self.kid)
        with self._lock:
            self._assertions.append(token)
        return token

    def write_federated_token_file(self, path, **kw):
        """Writes federated_token(**kw) to path the way the kubelet rotates
        it (a new file renamed over the old one); returns the token."""
        token = self.federated_token(**kw)
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        tmp.write_text(token)
        os.replace(tmp, path)
        return token

    def secrets(self):
        """Every secret this service knows or handed out (client secrets,
        tokens issued, assertions made), which must never appear in a log."""
        with self._lock:
            found = [c["secret"] for c in self._clients.values() if c["secret"]]
            found += [i.token for i in self.issued] + list(self._assertions)
        return found + [self.identity_header]

    def issued_for(self, audience):
        """The tokens issued for audience so far (Issued records)."""
        with self._lock:
            return [i for i in self.issued if i.audience == audience]

    def rotate_postgres_role(self, pg, role, audience=POSTGRES_AUDIENCE,
                             create=True):
        """Makes role's password follow the tokens issued for audience (see
        PostgresRotation); returns the PostgresRotation (close() undoes)."""
        return PostgresRotation(self, pg, role, audience, create)

    # HTTP

    def _handle(self, req, method):
        url = urlsplit(req.path)
        endpoint, tenant = self._classify(method, url.path)
        with self._lock:
            self.requests[endpoint] += 1
            delay, outage, stopped = self.delay, self.outage, self._run_stopped
        body = b""
        if method == "POST":
            length = int(req.headers.get("Content-Length") or 0)
            body = req.rfile.read(length) if length else b""
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        note = ""
        try:
            if endpoint in TOKEN_ENDPOINTS:
                if delay > 0 and stopped.wait(delay):
                    self._log(method, url.path, endpoint, "dropped", "stopped")
                    req.close_connection = True
                    return
                if outage:
                    raise _Refused(503, {
                        "error": "temporarily_unavailable",
                        "error_description": "The service is temporarily "
                                             "unavailable (ces2pg test outage)."})
                forced = self._take_forced(endpoint)
                if forced is not None:
                    note = "forced"
                    raise _Refused(*forced)
            status, answer, note = self._dispatch(endpoint, tenant, req, query,
                                                  body)
        except _Refused as refused:
            status, answer = refused.status, refused.body
            with self._lock:
                self.refusals.append((endpoint, status, answer))
        except HookError as e:
            status, answer = 500, {"error": "server_error",
                                   "error_description": f"issuance hook: {e}"}
        # Logged first: once a client has its answer, the log shows it.
        self._log(method, url.path, endpoint, status, note)
        self._send(req, status, answer)

    def _classify(self, method, path):
        parts = [p for p in path.split("/") if p]
        if path == IMDS_PATH and method == "GET":
            return "imds", None
        if path == APP_SERVICE_PATH and method == "GET":
            return "app_service", None
        if path == JWKS_PATH or (len(parts) >= 3 and parts[-1] == "keys"
                                 and parts[1] == "discovery"):
            return "jwks", None
        if len(parts) == 4 and parts[1:] == ["oauth2", "v2.0", "token"] \
                and method == "POST":
            return "token", parts[0]
        if len(parts) >= 3 and parts[-2:] == [".well-known",
                                              "openid-configuration"]:
            return "openid", parts[0]
        return "unknown", None

    def _take_forced(self, endpoint):
        with self._lock:
            for forced in self._forced:
                if forced[0] in (None, endpoint):
                    forced[3] -= 1
                    if forced[3] <= 0:
                        self._forced.remove(forced)
                    return forced[1], forced[2]
        return None

    def _dispatch(self, endpoint, tenant, req, query, body):
        if endpoint == "token":
            return self._token(tenant, body)
        if endpoint == "imds":
            return self._imds(req, query)
        if endpoint == "app_service":
            return self._app_service(req, query)
        if endpoint == "jwks":
            return 200, self.jwks(), ""
        if endpoint == "openid":
            return self._openid(tenant)
        raise _Refused(404, {"error": "not_found"})

    def _token(self, tenant, body):
        if tenant not in self._tenants:
            raise _Refused(*unknown_tenant_error(tenant))
        form = {k: v[0] for k, v in
                parse_qs(body.decode("utf-8", "replace"),
                         keep_blank_values=True).items()}
        for name in ("grant_type", "client_id", "scope"):
            if not form.get(name):
                raise _Refused(*missing_parameter_error(name))
        if form["grant_type"] != "client_credentials":
            raise _Refused(*entra_error(
                "unsupported_grant_type", 70003, "The app requested an "
                f"unsupported grant type '{form['grant_type']}'."))
        scope = form["scope"]
        if not scope.endswith("/.default") or " " in scope:
            raise _Refused(*entra_error(
                "invalid_scope", 1002012, f"The provided value for scope {scope} "
                "is not valid. Client credential flows must have a scope value "
                "with /.default suffixed to the resource identifier "
                "(application ID URI).", 400))
        client_id = form["client_id"]
        with self._lock:
            client = self._clients.get(client_id)
        if client is None or client["tenant"] != tenant:
            raise _Refused(*entra_error(
                "unauthorized_client", 700016, f"Application with identifier "
                f"'{client_id}' was not found in the directory '{tenant}'. This "
                "can happen if the application has not been installed by the "
                "administrator of the tenant or consented to by any user in the "
                "tenant. You may have sent your authentication request to the "
                "wrong tenant.", 400))
        if "client_assertion" in form or "client_assertion_type" in form:
            how = self._check_assertion(client, form)
        elif "client_secret" in form:
            if client["secret"] is None or not secrets.compare_digest(
                    form["client_secret"], client["secret"]):
                raise _Refused(*invalid_secret_error(client_id))
            how = "secret"
        else:
            raise _Refused(*entra_error(
                "invalid_client", 7000218, "The request body must contain the "
                "following parameter: 'client_assertion' or 'client_secret'.",
                401))
        audience = scope[:-len("/.default")]
        token = self.issue(audience, client_id, tenant=tenant, source="token")
        claims = jwt.decode(token, options={"verify_signature": False})
        lifetime = claims["exp"] - int(time.time())
        return 200, {"token_type": "Bearer", "expires_in": lifetime,
                     "ext_expires_in": lifetime, "access_token": token}, how

    def _check_assertion(self, client, form):
        if form.get("client_assertion_type") != CLIENT_ASSERTION_TYPE:
            raise _Refused(*missing_parameter_error("client_assertion_type"))
        assertion = form.get("client_assertion") or ""
        try:
            claims = jwt.decode(assertion, self._k8s_key.public_key(),
                                algorithms=["RS256"],
                                options={"verify_aud": False, "verify_exp": False,
                                         "verify_nbf": False, "verify_iat": False})
        except jwt.InvalidSignatureError:
            raise _Refused(*entra_error(
                "invalid_client", 700027, "Client assertion failed signature "
                "validation.", 401)) from None
        except jwt.PyJWTError:
            raise _Refused(*entra_error(
                "invalid_request", 50027, "JWT token is invalid or malformed.",
                400)) from None
        now = time.time()
        if claims.get("exp", 0) < now - 60:
            raise _Refused(*entra_error(
                "invalid_client", 700024, "Client assertion is not within its "
                f"valid time range. Current time: {_stamp(now)}, expiry time of "
                f"assertion {_stamp(claims.get('exp', 1))}.", 400))
        aud = claims.get("aud")
        auds = aud if isinstance(aud, list) else [aud]
        if (FEDERATED_AUDIENCE not in auds
                or claims.get("iss") != KUBERNETES_ISSUER
                or claims.get("sub") not in client["subjects"]):
            raise _Refused(*entra_error(
                "invalid_client", 70021, "No matching federated identity record "
                f"found for presented assertion. Assertion Issuer: "
                f"'{claims.get('iss')}'. Assertion Subject: "
                f"'{claims.get('sub')}'. Assertion Audience: '{aud}'.", 400))
        return "assertion"

    def _managed_identity(self, query, not_found):
        client_id = query.get("client_id")
        with self._lock:
            if client_id is not None:
                if client_id not in self._managed:
                    raise _Refused(*not_found)
                return client_id
            if self.system_identity in self._managed:
                return self.system_identity
        raise _Refused(*not_found)

    def _imds(self, req, query):
        if req.headers.get("Metadata", "").lower() != "true":
            raise _Refused(400, {"error": "invalid_request",
                                 "error_description": "Required metadata "
                                                      "header not specified"})
        if query.get("api-version") != IMDS_API_VERSION:
            raise _Refused(400, {
                "error": "Bad request. api-version was not specified in the "
                         "request or is not supported. For more information "
                         "refer to aka.ms/azureimds",
                "newest-versions": [IMDS_API_VERSION]})
        resource = query.get("resource")
        if not resource:
            raise _Refused(400, {"error": "invalid_request",
                                 "error_description": "Required audience "
                                                      "parameter not specified"})
        client_id = self._managed_identity(query, (400, {
            "error": "invalid_request", "error_description": "Identity not found"}))
        token = self.issue(resource, client_id, source="imds")
        claims = jwt.decode(token, options={"verify_signature": False})
        left = str(claims["exp"] - int(time.time()))
        return 200, {"access_token": token, "client_id": client_id,
                     "expires_in": left, "expires_on": str(claims["exp"]),
                     "ext_expires_in": left, "not_before": str(claims["nbf"]),
                     "resource": resource, "token_type": "Bearer"}, ""

    def _app_service(self, req, query):
        header = req.headers.get("X-IDENTITY-HEADER")
        if header is None:
            raise _Refused(401, {"statusCode": 401, "message": "Unauthorized. "
                                 "X-IDENTITY-HEADER header is missing."})
        if not secrets.compare_digest(header, self.identity_header):
            raise _Refused(403, {"statusCode": 403, "message": "Forbidden. "
                                 "X-IDENTITY-HEADER does not match."})
        if query.get("api-version") != APP_SERVICE_API_VERSION:
            raise _Refused(400, {"statusCode": 400, "message": "Unsupported "
                                 "api-version; use 2019-08-01."})
        resource = query.get("resource")
        if not resource:
            raise _Refused(400, {"statusCode": 400,
                                 "message": "resource is missing."})
        client_id = self._managed_identity(query, (400, {
            "statusCode": 400, "message": "No Managed Identity found for "
            "specified ClientId/ResourceId/PrincipalId.",
            "correlationId": str(uuid.uuid4())}))
        token = self.issue(resource, client_id, source="app_service")
        claims = jwt.decode(token, options={"verify_signature": False})
        return 200, {"access_token": token, "expires_on": str(claims["exp"]),
                     "resource": resource, "token_type": "Bearer",
                     "client_id": client_id}, ""

    def _openid(self, tenant):
        if tenant not in self._tenants:
            raise _Refused(*unknown_tenant_error(tenant))
        return 200, {
            "issuer": f"https://login.microsoftonline.com/{tenant}/v2.0",
            "token_endpoint": self.token_url(tenant),
            "jwks_uri": self.jwks_url,
            "token_endpoint_auth_methods_supported": [
                "client_secret_post", "private_key_jwt"],
            "response_types_supported": ["token"],
            "id_token_signing_alg_values_supported": ["RS256"],
        }, ""

    @staticmethod
    def _send(req, status, body):
        if isinstance(body, (dict, list)):
            data, ctype = json.dumps(body).encode(), "application/json; charset=utf-8"
        else:
            data = body.encode() if isinstance(body, str) else bytes(body)
            ctype = "text/html; charset=utf-8"
        with contextlib.suppress(OSError):  # the client may have given up
            req.send_response(status)
            req.send_header("Content-Type", ctype)
            req.send_header("Content-Length", str(len(data)))
            req.send_header("Cache-Control", "no-store, no-cache")
            req.end_headers()
            req.wfile.write(data)

    def _log(self, method, path, endpoint, status, note):
        if self.log_path is None:
            return
        line = (f"{_stamp()} {method} {path} {endpoint} {status}"
                f"{' ' + note if note else ''}\n")
        with self._lock, open(self.log_path, "a") as f:
            f.write(line)


class PostgresRotation:
    """A PostgreSQL role whose password is each token issued for audience,
    like a role made by pgaadauth_create_principal() on Azure Database for
    PostgreSQL: it may log in over 127.0.0.1 (or the socket) only with
    scram-sha-256 and the latest token. Made by
    IdentityService.rotate_postgres_role(pg, role); pg is harness.postgres's
    Postgres (its superuser runs ALTER ROLE; pg.require_password adds the
    pg_hba.conf rule). Until the first token the role has no password.

    count      tokens set as the password so far
    password   the latest (None before the first)
    """

    def __init__(self, service, pg, role, audience, create):
        self.service, self.pg, self.role, self.audience = service, pg, role, audience
        self.count, self.password = 0, None
        if create and not pg.sql("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                 (role,)):
            pg.sql(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        pg.require_password(role)
        service.on_issue(self)

    def __call__(self, audience, token, exp):
        if audience != self.audience:
            return
        with contextlib.closing(psycopg2.connect(self.pg.conninfo)) as conn:
            conn.autocommit = True
            with conn.cursor() as cur:
                # The statement would carry the token into pg_stat_statements.
                cur.execute("SET pg_stat_statements.track_utility = off")
                cur.execute("SET password_encryption = 'scram-sha-256'")
                cur.execute(sql.SQL("ALTER ROLE {} PASSWORD %s").format(
                    sql.Identifier(self.role)), (token,))
        self.count += 1
        self.password = token

    def conninfo_for(self, dbname, password=None):
        """libpq conninfo of the role over TCP (password only if given)."""
        info = (f"host={self.pg.host} port={self.pg.port} dbname={dbname} "
                f"user={self.role}")
        return info + (f" password={password}" if password else "")

    def close(self):
        """Stops rotating and drops the pg_hba.conf rule (trust again)."""
        self.service.remove_hook(self)
        self.pg.stop_requiring_password(self.role)
