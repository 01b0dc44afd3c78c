"""fleetadmin settings.

Every value a deployment may change is read from the environment through the
strict helpers in ``fleetadmin.env``. The embedded default (SQLite, the ORM
broker, the in-memory channel layer, local pods) needs none of them.

Length: Django reads one settings module, and each setting sits beside the others it is
checked against; split by topic, a reader would hunt for a value across files.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import timedelta
from pathlib import Path

import dj_database_url

from fleetadmin.env import EnvError, envbool, envdollars, envfloat, envint, envproxyheader, envsecret, envstr

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(envstr("FLEETADMIN_VAR_DIR", str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = envbool("DEBUG", False)
DATABASE_URL = envstr("DATABASE_URL")
REDIS_URL = envstr("REDIS_URL")


def _embedded_secret_key() -> str:
    # The embedded default keeps a generated key beside its database so that
    # sessions survive a restart; a scaled-out deployment must supply its own.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        # Made 0600 before the key is written (review L1: written, then chmod-ed, it was readable
        # by others in between), and only if no other process made it first.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = envsecret("SECRET_KEY")
if not SECRET_KEY:
    if DATABASE_URL:
        raise EnvError("SECRET_KEY (or SECRET_KEY_FILE) is required when DATABASE_URL is set")
    SECRET_KEY = _embedded_secret_key()

ALLOWED_HOSTS = [h.strip() for h in envstr("ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [o.strip() for o in envstr("CSRF_TRUSTED_ORIGINS").split(",") if o.strip()]

# Transport security (issue 23). A scaled-out deployment (DATABASE_URL set) is served over HTTPS,
# its own or a TLS-terminating proxy's: a plain-HTTP request is redirected, cookies are Secure and
# browsers are told to use HTTPS only (HSTS). The embedded default serves http://127.0.0.1 as it
# always has. FLEETADMIN_HTTPS=false says plain HTTP is intended (the test suite's loopback
# servers); each setting below has its own variable as well.
HTTPS = envbool("FLEETADMIN_HTTPS", bool(DATABASE_URL))
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", HTTPS)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # a load balancer's probe of the front's own port
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", HTTPS)
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", HTTPS)
# HSTS goes out on HTTPS answers only; a year is what check --deploy and preload lists ask for.
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 365 * 24 * 3600 if HTTPS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", HTTPS)
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)  # a promise for the whole domain: opt in
# Only behind a proxy that sets this header on every request (and that the front is reachable
# through alone): anyone who reaches the front directly could claim HTTPS with it.
SECURE_PROXY_SSL_HEADER = envproxyheader("SECURE_PROXY_SSL_HEADER")

# The Content-Security-Policy of every page (django-csp; issue 38, N3 and N9): scripts and styles
# from our own origin only, no inline script or style, no eval (htmx's allowEval is off too,
# templates/base.html), images from our origin or made in the page (pdf.js), nothing fetched from
# or posted to another origin, and no framing. 'self' covers the dashboard's websocket on the same
# host (ws: for http, wss: for https). A response that sets its own policy keeps it (documents are
# served sandboxed, ocrjobs/viewer_views.py).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:", "blob:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}
# Static files' own (fleetadmin/staticpolicy.py): it takes effect in pdf.js's worker, which
# compiles its image decoders from WebAssembly; eval stays refused there too.
STATIC_CONTENT_SECURITY_POLICY = {
    **CONTENT_SECURITY_POLICY["DIRECTIVES"],
    "script-src": ["'self'", "'wasm-unsafe-eval'"],
}

# Not "daphne": its app only swaps runserver for its own (the front is `python -m fleetadmin.front`)
# and imports Twisted's server on start, 0.35 s of CPU in every manage.py process (manage.py ocr,
# each worker cluster) for nothing they use (issue 27).
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_q",
    "axes",
    "fleetadmin",
    "accounts",
    "pods",
    "ocrjobs",
]

MIDDLEWARE = [
    # Django's and django-csp's, each run on the front's loop where it cannot block it
    # (fleetadmin/middleware.py): a request no longer hops to a thread and back for each.
    "fleetadmin.middleware.LoopSecurityMiddleware",
    "fleetadmin.middleware.LoopSessionMiddleware",
    "fleetadmin.middleware.LoopCommonMiddleware",
    "fleetadmin.middleware.LoopCsrfViewMiddleware",
    "fleetadmin.middleware.LoopAuthenticationMiddleware",
    "fleetadmin.middleware.LoopMessageMiddleware",
    "fleetadmin.middleware.LoopXFrameOptionsMiddleware",
    "fleetadmin.middleware.LoopCSPMiddleware",
    # Last, as django-axes asks: it turns a refused login into its lock-out answer.
    "axes.middleware.AxesMiddleware",
]

# Django's checks that its middleware is in MIDDLEWARE, by dotted path, and the session cookie's
# as they read without it: fleetadmin/checks.py asks the same of the classes that extend Django's,
# and runs again the checks the missing paths would skip.
SILENCED_SYSTEM_CHECKS = ["security.W001", "security.W002", "security.W003", "security.W010", "security.W013"]

ROOT_URLCONF = "fleetadmin.urls"
ASGI_APPLICATION = "fleetadmin.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if DATABASE_URL:
    # Persistent connections (29 tasks/s without, 93 with, on the ORM broker), checked before
    # reuse so that a database restart costs one failed query, not a stuck worker.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=None, conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        raise EnvError("DATABASE_URL is for PostgreSQL; leave it unset for the embedded SQLite")
    # The front (daphne) runs each request on a thread of its own, where a persistent connection
    # is opened and lost every time: fleetadmin/asgi.py gives the front this pool instead
    # (psycopg_pool). Workers keep persistent connections: a pool does not survive django-q2's fork.
    DATABASE_FRONT_POOL = {
        "min_size": 2,
        "max_size": envint("DATABASE_FRONT_POOL_SIZE", 16, minimum=1),
        "timeout": 10.0,  # seconds a request waits for a free connection
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": envstr("SQLITE_PATH", str(VAR_DIR / "db.sqlite3")),
            # WAL alone gave more "database is locked" than the default; WAL
            # with IMMEDIATE transactions and a busy timeout gave none.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": ("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;"),
            },
            # A file, not memory: end-to-end tests share it with daphne and qcluster.
            # One file per test run, so that two runs in one checkout never share it.
            "TEST": {"NAME": envstr("SQLITE_TEST_PATH", str(VAR_DIR / f"test-{os.getpid()}.sqlite3"))},
        }
    }
    # The front keeps idle connections for its next requests (fleetadmin/pooled_sqlite): opening
    # one costs ~1.7 ms of CPU, and a submission opened two.
    DATABASE_FRONT_POOL = {"max_size": envint("DATABASE_FRONT_POOL_SIZE", 8, minimum=1)}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# django-q2. The database, not the broker, keeps every page: a task lost by
# the broker is started again by the scaler tick. `retry` stays well above
# `timeout` so a slow task is never run twice at once.
# Work comes in four classes, each a cluster with capacity of its own (fleetadmin/clusters.py):
# short tasks (this cluster, Q_WORKERS), passes, dispatch loops and outputs (ALT_CLUSTERS, below).
# Q_CLUSTER_NAME names the deployment's queues; the other classes' clusters run under
# "<name>:passes", "<name>:dispatch" and "<name>:outputs", which is how django-q2 picks their
# ALT_CLUSTERS entry.
Q_CLUSTER_NAME = envstr("Q_CLUSTER_NAME", "fleetadmin").partition(":")[0]
Q_TIMEOUT = envint("Q_TIMEOUT", 900, minimum=30)
Q_SUCCESSES_KEPT = envint("Q_SUCCESSES_KEPT", 1000, minimum=0)
Q_CLUSTER = {
    "name": Q_CLUSTER_NAME,
    "workers": envint("Q_WORKERS", 4, minimum=1),
    "recycle": 500,
    "timeout": Q_TIMEOUT,
    "retry": Q_TIMEOUT * 2,
    "max_attempts": 3,
    "catch_up": False,
    # Successful tasks kept: pruned by the minute's scaler tick (fleetadmin/clusters.py), not by
    # django-q2's monitor, which loads every one kept before saving each task (34 ms a task at 1,000).
    "save_limit": 0,
    "ack_failures": True,
    "poll": 0.2,
    "label": "Tasks",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"
    Q_CLUSTER["broker_class"] = "fleetadmin.brokers.OrmBroker"  # django-q2's, with a cheaper empty poll

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Login throttling (django-axes) for every password login, /login/ and /admin/login/ alike; API
# tokens are not passwords and are not counted. After LOGIN_FAILURE_LIMIT failures for one user
# name from one client address, that pair is refused (429), even with the right password, until
# LOGIN_LOCKOUT_SECONDS after the last failure. By name and address together, so that nobody can
# lock a user out from elsewhere, and a proxy's address does not lock out everyone behind it.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out login before the password is checked
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(seconds=envint("LOGIN_LOCKOUT_SECONDS", 900, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"  # answered with 429
AXES_VERBOSE = False  # no start-up banner in every process; lock-outs are still logged
# The client's address is REMOTE_ADDR alone, never a header a client can write (X-Forwarded-For):
# behind a proxy, the front's --proxy-headers sets REMOTE_ADDR from the proxy's header. This holds
# if django-ipware is ever installed too (axes then asks it, in this order only).
AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
MEDIA_ROOT = Path(envstr("MEDIA_ROOT", str(VAR_DIR / "media"))).resolve()

# Documents (uploads, fetched URL documents, what the split keeps for pods) go through Django's
# storage API (ocrjobs/storage.py): files under MEDIA_ROOT by default, S3-compatible object
# storage when STORAGE_S3_BUCKET is set, so that every front and worker host reads what another
# stored. Page results are rows in the database, not files (docs/architecture.md, "Storage").
STORAGE_S3_BUCKET = envstr("STORAGE_S3_BUCKET")
if STORAGE_S3_BUCKET:
    _documents_storage = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": STORAGE_S3_BUCKET,
            "endpoint_url": envstr("STORAGE_S3_ENDPOINT_URL") or None,  # unset: AWS itself
            "access_key": envsecret("AWS_ACCESS_KEY_ID") or None,  # unset: boto3's own chain (roles, ~/.aws)
            "secret_key": envsecret("AWS_SECRET_ACCESS_KEY") or None,
            "region_name": envstr("STORAGE_S3_REGION") or None,
            "addressing_style": envstr("STORAGE_S3_ADDRESSING_STYLE") or None,  # "path" for most S3 look-alikes
            "location": envstr("STORAGE_S3_PREFIX"),  # a folder of the bucket
            "signature_version": "s3v4",
            "default_acl": None,  # the bucket's own policy: documents are never public
            "file_overwrite": True,  # names are unique already; saves a HEAD request per upload
        },
    }
else:
    _documents_storage = {"BACKEND": "django.core.files.storage.FileSystemStorage"}  # MEDIA_ROOT
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "documents": _documents_storage,
}
# A read of a document from object storage on the request path (the viewer's bytes and ranges,
# their size): a total time spent waiting on the storage server, connect, headers and body
# together (the time a slow browser takes to take the bytes is its own), and never more bytes
# than asked for (ocrjobs/storage.py).
STORAGE_READ_TIMEOUT_SECONDS = envfloat("STORAGE_READ_TIMEOUT_SECONDS", 60.0, minimum=1.0)

# Every multipart body is read by fleetadmin/formdata.py (the front's as they arrive): each file
# written to a temporary file of its own and hashed on the way (the sha256 pods cache it under).
FILE_UPLOAD_HANDLERS = ["ocrjobs.uploads.FormDataUploadHandler"]

# OCR limits (bad input gets a clear error, never a half-made job).
OCR_MAX_FILE_BYTES = envint("OCR_MAX_FILE_BYTES", 200 * 1024 * 1024, minimum=1)
OCR_MAX_PAGES_PER_DOCUMENT = envint("OCR_MAX_PAGES_PER_DOCUMENT", 3000, minimum=1)
OCR_MAX_FILES_PER_JOB = envint("OCR_MAX_FILES_PER_JOB", 1000, minimum=1)
OCR_MAX_IMAGE_PIXELS = envint("OCR_MAX_IMAGE_PIXELS", 100_000_000, minimum=1)
OCR_RENDER_DPI = envint("OCR_RENDER_DPI", 200, minimum=50)
# Pixels of one document, summed over its pages or frames (issue 38, N2): a TIFF of 3,000 blank
# 100-megapixel frames is 10 MB on disk and 300 gigapixels to read or draw. 3,000 letter pages
# at 300 DPI are 25 gigapixels: by default 10 megapixels a page of the most pages a document may
# have (30 gigapixels at 3,000 pages), so that a deployment that takes longer documents takes
# their pixels too.
OCR_MAX_DOCUMENT_PIXELS = envint("OCR_MAX_DOCUMENT_PIXELS", 10_000_000 * OCR_MAX_PAGES_PER_DOCUMENT, minimum=1)
# The job page's viewer: pages whose confidence (0-100) is under this are listed first, "to check".
VIEWER_CONFIDENCE_THRESHOLD = envfloat("VIEWER_CONFIDENCE_THRESHOLD", 80.0, minimum=0.0)
# A page read at a confidence (0-100) under this carries a warning: the job, the API and the CLI's
# exit code say so (issue 40). The garbage of an upside-down page read as it came was at 4.
OCR_WARN_CONFIDENCE_BELOW = envfloat("OCR_WARN_CONFIDENCE_BELOW", 30.0, minimum=0.0)
DATA_UPLOAD_MAX_NUMBER_FILES = OCR_MAX_FILES_PER_JOB

# Pages and dispatch.
PAGE_CLAIM_SECONDS = envfloat("PAGE_CLAIM_SECONDS", 60.0, minimum=1.0)
PAGE_MAX_ATTEMPTS = envint("PAGE_MAX_ATTEMPTS", 3, minimum=1)
PAGE_TIMEOUT_SECONDS = envfloat("PAGE_TIMEOUT_SECONDS", 120.0, minimum=1.0)
# A pod's answer to a page longer than this costs the page an attempt (read no further).
POD_ANSWER_MAX_BYTES = envint("POD_ANSWER_MAX_BYTES", 4 * 1024 * 1024, minimum=1024)
# The documents a dispatcher sends to pods at once, in bytes (one larger goes alone): pods get
# theirs in turn and start reading, rather than all at the end of a shared link; and the bodies
# sent over TLS, read whole, are bounded in memory (ocrjobs/dispatch/sending.py, DocumentGate).
DISPATCH_DOCUMENT_BYTES_IN_FLIGHT = envint("DISPATCH_DOCUMENT_BYTES_IN_FLIGHT", 64 * 1024 * 1024, minimum=1)
DISPATCH_MAX_SECONDS = envfloat("DISPATCH_MAX_SECONDS", 720.0, minimum=10.0)

# Pods.
# The first part of every pod name; unset: the one the database keeps (fleetadmin/deployment.py).
DEPLOYMENT_PREFIX = envstr("FLEETADMIN_DEPLOYMENT", "")
LOCAL_POD_LANES = envint("LOCAL_POD_LANES", max(1, (os.cpu_count() or 1)), minimum=1)
LOCAL_POD_MAX_PODS = envint("LOCAL_POD_MAX_PODS", 1, minimum=0)
# Local pods each local pool keeps ready without work (a floor under its min pods, within max
# pods): a job's first page then waits for no boot. `manage.py up` (the embedded default) sets 1.
LOCAL_WARM_PODS = envint("LOCAL_WARM_PODS", 0, minimum=0)
# Local pods confined to their own files by Landlock (podserver/sandbox.py); off: as the workers.
LOCAL_POD_SANDBOX = envbool("LOCAL_POD_SANDBOX", True)
# Local pods belong to the host that started them (fleetadmin/hosts.py): each worker host reports
# every HOST_REPORT_SECONDS; one silent for HOST_LOST_AFTER_SECONDS has its local pods marked lost
# by whichever host reconciles, and their pages wait again.
HOST_ID = envstr("HOST_ID", socket.gethostname())[:100]
HOST_REPORT_SECONDS = envfloat("HOST_REPORT_SECONDS", 5.0, minimum=0.1)
HOST_LOST_AFTER_SECONDS = envfloat("HOST_LOST_AFTER_SECONDS", 60.0, minimum=1.0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}
DISPATCHER_STALE_SECONDS = envfloat("DISPATCHER_STALE_SECONDS", 20.0, minimum=2.0)
DISPATCHERS_PER_POOL = envint("DISPATCHERS_PER_POOL", 1, minimum=1)
# Task leases (fleetadmin/leases.py): a split or fetch task renews its lease while it
# works; the scaler sends again a task that did not start within the grace, or
# stopped renewing (its worker killed, the broker lost it). Boots are steps of passes.
TASK_LEASE_SECONDS = envfloat("TASK_LEASE_SECONDS", 60.0, minimum=1.0)
TASK_START_GRACE_SECONDS = envfloat("TASK_START_GRACE_SECONDS", 300.0, minimum=1.0)
# A searchable PDF's build whose worker died this many times (a document that kills it) fails.
PDF_BUILD_ATTEMPTS = envint("PDF_BUILD_ATTEMPTS", 3, minimum=1)
# Rebuilds of a job's searchable PDFs one user may ask for in any hour (issue 38, N2): each may
# hold the outputs workers for a build's time limit.
OUTPUT_REBUILDS_PER_HOUR = envint("OUTPUT_REBUILDS_PER_HOUR", 10, minimum=1)
OCR_LANGUAGES = [lang.strip() for lang in envstr("OCR_LANGUAGES", "eng").split(",") if lang.strip()]
OCR_MAX_REQUEST_BYTES = envint("OCR_MAX_REQUEST_BYTES", 2 * 1024 * 1024 * 1024, minimum=1)
# The front against slow or many clients (fleetadmin/front.py).
FRONT_HEADER_TIMEOUT_SECONDS = envfloat("FRONT_HEADER_TIMEOUT_SECONDS", 30.0, minimum=1.0)
FRONT_BODY_GRACE_SECONDS = envfloat("FRONT_BODY_GRACE_SECONDS", 10.0, minimum=0.0)
FRONT_BODY_MIN_BYTES_PER_SECOND = envint("FRONT_BODY_MIN_BYTES_PER_SECOND", 8192, minimum=0)
# Bodies in flight (issue 38, N1): a large one (over FRONT_SMALL_BODY_BYTES) only for a token or a
# session that may submit, to an upload path, known before its body is read; small ones (logins,
# forms) from a budget of their own; both per client address (the proxy's, with --proxy-headers)
# and large ones per user; each within a total time.
FRONT_MAX_BODIES_IN_FLIGHT = envint("FRONT_MAX_BODIES_IN_FLIGHT", 64, minimum=1)
FRONT_SMALL_BODY_BYTES = envint("FRONT_SMALL_BODY_BYTES", 64 * 1024, minimum=1024)
FRONT_MAX_SMALL_BODIES_IN_FLIGHT = envint("FRONT_MAX_SMALL_BODIES_IN_FLIGHT", 1024, minimum=1)
FRONT_MAX_BODIES_PER_CLIENT = envint("FRONT_MAX_BODIES_PER_CLIENT", 32, minimum=1)
FRONT_MAX_UPLOADS_PER_USER = envint("FRONT_MAX_UPLOADS_PER_USER", 16, minimum=1)
FRONT_SMALL_BODY_SECONDS = envfloat("FRONT_SMALL_BODY_SECONDS", 20.0, minimum=1.0)
FRONT_BODY_DEADLINE_SECONDS = envfloat("FRONT_BODY_DEADLINE_SECONDS", 3600.0, minimum=1.0)
# Spend (issue 23): a new pool's $/h cap as the admin form offers it, and what a user's jobs may
# cost in any 24 hours unless their Budget says otherwise (`none`: no limit; staff have none).
POOL_DEFAULT_DOLLARS_PER_HOUR = envdollars("POOL_DEFAULT_DOLLARS_PER_HOUR", "20")
USER_DOLLARS_PER_DAY = envdollars("USER_DOLLARS_PER_DAY", "50")
CAPACITY_VERDICT_TTL_SECONDS = envfloat("CAPACITY_VERDICT_TTL_SECONDS", 90.0, minimum=1.0)
CATALOGUE_TTL_SECONDS = envfloat("CATALOGUE_TTL_SECONDS", 60.0, minimum=1.0)
POD_CREATE_TIMEOUT_SECONDS = envfloat("POD_CREATE_TIMEOUT_SECONDS", 120.0, minimum=1.0)
# A boot waits this long for a cheaper candidate that other boots are creating on before it takes
# a dearer one (pods/services/boot.py _waits_for_cheaper).
BOOT_CHEAPER_WAIT_SECONDS = envfloat("BOOT_CHEAPER_WAIT_SECONDS", 10.0, minimum=0.0)
POD_RUNNING_TIMEOUT_SECONDS = envfloat("POD_RUNNING_TIMEOUT_SECONDS", 600.0, minimum=1.0)
POD_READY_TIMEOUT_SECONDS = envfloat("POD_READY_TIMEOUT_SECONDS", 600.0, minimum=1.0)
# How often a boot asks the provider (and the pod) how it is doing: 32 boots at 0.2 s were
# 130 GraphQL calls a second, for pods that take minutes to come up.
POD_POLL_SECONDS = envfloat("POD_POLL_SECONDS", 1.0, minimum=0.01)
# A cloud pod that is still coming up after ten polls is asked twice as seldom each ten polls more,
# up to this (pods/services/boot.py _poll_seconds).
POD_POLL_MAX_SECONDS = envfloat("POD_POLL_MAX_SECONDS", 10.0, minimum=0.01)
# The workers' CPU priority below the front's (nice increment, 0-19): on a machine they share,
# the front answers first and the workers use what is left (fleetadmin/apps.py).
WORKERS_NICE = envint("WORKERS_NICE", 5, minimum=0)
# RunPod (pods/providers/runpod.py). The SDK itself reads RUNPOD_API_BASE_URL on every
# call (the simulator is pointed at that way); these are ours. The URL template's
# placeholders: {pod_id}, {port} (the pod server's port inside the pod), {ip} and
# {public_port} (from the pod's runtime port mapping).
RUNPOD_API_KEY = envsecret("RUNPOD_API_KEY")
RUNPOD_POD_URL_TEMPLATE = envstr("RUNPOD_POD_URL_TEMPLATE", "https://{pod_id}-{port}.proxy.runpod.net")
# Seconds slept between tries of a transient failure (three tries, each delay jittered and never
# shorter than a Retry-After RunPod names); tests shorten it. One provider call, its tries and
# waits together, takes at most RUNPOD_CALL_SECONDS: below a boot step's lease (120 s).
RUNPOD_RETRY_DELAYS = (0.5, 1.0)
RUNPOD_CALL_SECONDS = envfloat("RUNPOD_CALL_SECONDS", 90.0, minimum=1.0)
# An account whose balance or spending limit refused a pod boots nothing for this long (an alert
# says why); then one boot tries again, and a pod it gets clears the alert.
BALANCE_RETRY_SECONDS = envfloat("BALANCE_RETRY_SECONDS", 600.0, minimum=1.0)
# Passes (pods/services/passes.py): boots, releases, scale requests and shed ticks are rows
# that a pass advances one short step at a time, PASS_CONCURRENCY steps at once (each one
# provider call or one pod health check), PASS_BATCH rows of each kind per pass. The workers'
# supervisor asks for a pass every PASS_INTERVAL_SECONDS while anything is due.
PASS_CONCURRENCY = envint("PASS_CONCURRENCY", 32, minimum=1)
PASS_BATCH = envint("PASS_BATCH", 500, minimum=1)
PASS_INTERVAL_SECONDS = envfloat("PASS_INTERVAL_SECONDS", 0.5, minimum=0.05)
# A pass renews its lease while its steps run: one killed with -9 stops the others no longer than this.
PASS_LEASE_SECONDS = envfloat("PASS_LEASE_SECONDS", 30.0, minimum=1.0)
# A pass's steps are bounded by their own timeouts (a RunPod call: three tries of 30 s at most).
PASS_TIMEOUT_SECONDS = 300
PASS_START_GRACE_SECONDS = 30.0  # a queued pass that did not start by then was lost: sent again
# The other work classes' clusters (fleetadmin/clusters.py). Passes: one runs at a time
# deployment-wide (its lease), so one worker is enough, and a pass never queues behind short
# tasks. Dispatch loops: one worker each; `manage.py workers` sizes the cluster to
# DISPATCHERS_PER_POOL × pools (Q_DISPATCH_WORKERS is what it tells that cluster), and its time
# limit leaves a loop that reached DISPATCH_MAX_SECONDS the time to finish the pages in flight.
Q_PASS_WORKERS = envint("Q_PASS_WORKERS", 1, minimum=1)
Q_DISPATCH_WORKERS = envint("Q_DISPATCH_WORKERS", DISPATCHERS_PER_POOL, minimum=1)
Q_PASS_TIMEOUT = PASS_TIMEOUT_SECONDS
Q_DISPATCH_TIMEOUT = int(DISPATCH_MAX_SECONDS + PAGE_TIMEOUT_SECONDS + 60)
# Outputs (searchable PDFs): builds at once, deployment-wide per workers host, and how much lower
# their CPU priority is than the other workers' (nice increment on top of WORKERS_NICE): a build
# yields the CPU to splits, dispatch and local pods (invariant 20).
Q_OUTPUT_WORKERS = envint("Q_OUTPUT_WORKERS", 1, minimum=1)
Q_OUTPUT_TIMEOUT = Q_TIMEOUT
OUTPUTS_NICE = envint("OUTPUTS_NICE", 10, minimum=0)
# Builds one user's documents may hold at once (ocrjobs/services/build_turns.py: builds are taken
# in turn by owner; with more than one outputs worker, a user's storm leaves the others room).
PDF_BUILDS_PER_OWNER = envint("PDF_BUILDS_PER_OWNER", max(1, Q_OUTPUT_WORKERS // 2), minimum=1)
Q_CLUSTER["ALT_CLUSTERS"] = {
    f"{Q_CLUSTER_NAME}:passes": {"workers": Q_PASS_WORKERS, "timeout": Q_PASS_TIMEOUT, "retry": Q_PASS_TIMEOUT * 2},
    f"{Q_CLUSTER_NAME}:dispatch": {
        "workers": Q_DISPATCH_WORKERS,
        "timeout": Q_DISPATCH_TIMEOUT,
        "retry": Q_DISPATCH_TIMEOUT * 2,
    },
    f"{Q_CLUSTER_NAME}:outputs": {
        "workers": Q_OUTPUT_WORKERS,
        "timeout": Q_OUTPUT_TIMEOUT,
        "retry": Q_OUTPUT_TIMEOUT * 2,
    },
}
RECONCILE_GRACE_SECONDS = envfloat("RECONCILE_GRACE_SECONDS", 60.0, minimum=0.0)
AUTH_RETRY_SECONDS = envfloat("AUTH_RETRY_SECONDS", 300.0, minimum=1.0)
SCALE_TARGET_SECONDS = envfloat("SCALE_TARGET_SECONDS", 120.0, minimum=1.0)
SCALE_SECONDS_PER_PAGE_GUESS = envfloat("SCALE_SECONDS_PER_PAGE_GUESS", 2.0, minimum=0.001)
# Cost-aware sizing: every pod costs its boot and its idle tail (the pool's idle_seconds)
# beyond its pages. No more pods are wanted than keep that fixed cost within this share
# of the work waiting (0 turns the cap off). A boot's length is measured from the pool's
# last boots; SCALE_BOOT_SECONDS_GUESS until there are some.
SCALE_MAX_OVERHEAD = envfloat("SCALE_MAX_OVERHEAD", 0.12, minimum=0.0)
SCALE_BOOT_SECONDS_GUESS = envfloat("SCALE_BOOT_SECONDS_GUESS", 60.0, minimum=0.0)
# A submission's forecast reuses a pool's measurements and price for this long (0: read every time).
FORECAST_BASIS_SECONDS = envfloat("FORECAST_BASIS_SECONDS", 5.0, minimum=0.0)
STALL_SECONDS = envfloat("STALL_SECONDS", 60.0, minimum=1.0)
# Machines we do not control (invariant 17): a total deadline over DNS, connect, headers and body.
URL_FETCH_TIMEOUT_SECONDS = envfloat("URL_FETCH_TIMEOUT_SECONDS", 120.0, minimum=1.0)
# Fetches of one URL document that started and never finished (killed, lost) before it fails.
URL_FETCH_MAX_ATTEMPTS = envint("URL_FETCH_MAX_ATTEMPTS", 3, minimum=1)
# Fetches at once, deployment-wide: the short-task workers they may hold (half, by default).
URL_FETCH_MAX_IN_FLIGHT = envint("URL_FETCH_MAX_IN_FLIGHT", max(1, Q_CLUSTER["workers"] // 2), minimum=1)
# ... of them one user's, and on one host (fleetadmin/fairshare.py: slots taken in turn by owner,
# review N6): under the whole, so that one user's slow URLs always leave a slot to the others.
URL_FETCH_MAX_IN_FLIGHT_PER_OWNER = envint(
    "URL_FETCH_MAX_IN_FLIGHT_PER_OWNER", max(1, URL_FETCH_MAX_IN_FLIGHT // 2), minimum=1
)
URL_FETCH_MAX_IN_FLIGHT_PER_HOST = envint(
    "URL_FETCH_MAX_IN_FLIGHT_PER_HOST", max(1, URL_FETCH_MAX_IN_FLIGHT // 2), minimum=1
)
WEBHOOK_TIMEOUT_SECONDS = envfloat("WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=1.0)
# Webhook attempts in flight at once, deployment-wide: each holds a short-task worker that long at most.
WEBHOOK_MAX_IN_FLIGHT = envint("WEBHOOK_MAX_IN_FLIGHT", 2, minimum=1)
# ... of them one user's, and to one host (taken in turn by owner, like the fetches').
WEBHOOK_MAX_IN_FLIGHT_PER_OWNER = envint(
    "WEBHOOK_MAX_IN_FLIGHT_PER_OWNER", max(1, WEBHOOK_MAX_IN_FLIGHT // 2), minimum=1
)
WEBHOOK_MAX_IN_FLIGHT_PER_HOST = envint("WEBHOOK_MAX_IN_FLIGHT_PER_HOST", max(1, WEBHOOK_MAX_IN_FLIGHT // 2), minimum=1)
WEBHOOK_SECRET_GRACE_SECONDS = envfloat("WEBHOOK_SECRET_GRACE_SECONDS", 86400.0, minimum=0.0)
# Only for tests and closed networks: lets documents be fetched from private and loopback addresses.
URL_FETCH_ALLOW_PRIVATE = envbool("URL_FETCH_ALLOW_PRIVATE", False)
