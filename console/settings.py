"""The one settings module: twelve-factor, every value from the environment.

See `.env.example` for the list of variables. Defaults give the embedded set-up: SQLite under
`var/` and an embedded Redis on a unix socket under `var/`, which `make run` starts.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from console import env

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env.get_str("NPU_CONSOLE_VAR_DIR") or BASE_DIR / "var").resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env.get_bool("DEBUG", False)
SECRET_KEY = env.secret_key(VAR_DIR)
ALLOWED_HOSTS = env.get_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.get_list("CSRF_TRUSTED_ORIGINS", [])
# The console's address as people reach it: absolute links in incident webhooks.
PUBLIC_URL = env.check_url(
    "PUBLIC_URL", env.get_str("PUBLIC_URL") or "http://127.0.0.1:8000", {"http", "https"}
).rstrip("/")

# --- database -------------------------------------------------------------------------------
DATABASE_URL = env.check_url(
    "DATABASE_URL",
    env.get_str("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'console.sqlite3'}",
    {"sqlite", "postgres", "postgresql", "pgsql"},
)
try:
    _db = dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)
except ValueError as exc:
    raise env.EnvError(f"DATABASE_URL: malformed URL ({exc})") from None
if _db["ENGINE"].endswith("sqlite3"):
    # WAL + IMMEDIATE transactions: the web server and the console worker write concurrently.
    _db["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    _db["CONN_MAX_AGE"] = 0
    # A file, not memory: tests start real worker processes that share the test database.
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test-console-{os.getpid()}.sqlite3")}
DATABASES = {"default": _db}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- redis / celery -------------------------------------------------------------------------
EMBEDDED_REDIS = not env.get_str("REDIS_URL")
EMBEDDED_REDIS_SOCKET = VAR_DIR / "redis.sock"
REDIS_URL = env.check_url(
    "REDIS_URL",
    env.get_str("REDIS_URL") or f"unix://{EMBEDDED_REDIS_SOCKET}",
    {"redis", "rediss", "unix"},
)
CELERY_BROKER_URL = REDIS_URL.replace("unix://", "redis+socket://", 1)
CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_TASK_DEFAULT_QUEUE = "console"
CELERY_TASK_ACKS_LATE = False  # opted into per task, only where the task is idempotent
# An acks_late task whose worker died is delivered again after this long (Redis transport),
# found by a sweep every min(10 s, that) instead of kombu's default ~100 s.
BROKER_VISIBILITY_TIMEOUT_S = env.get_int("CELERY_VISIBILITY_TIMEOUT_S", 3600, minimum=1)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": BROKER_VISIBILITY_TIMEOUT_S,
    "unacked_restore_interval": min(10, BROKER_VISIBILITY_TIMEOUT_S),
    "unacked_restore_throttle": 1,
}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# No pidbox: nobody who reaches the broker can inspect, reconfigure or shut down a console
# worker with `celery control` broadcasts (tests/security/test_remote_control.py).
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Node keys (console/inventory/identity.py) are derived from this, else from SECRET_KEY.
NODE_KEY_SECRET = env.get_str("NODE_KEY_SECRET") or ""
# Per-node Redis ACL users for the host agents (console/inventory/redis_acl.py; Redis >= 7).
REDIS_MANAGE_ACL = env.get_bool("REDIS_MANAGE_ACL", False)
# The ports engines are given on each host (docs/operations.md); a port something else listens
# on (the agent reports them) or that refused a bind is skipped.
ENGINE_PORT_RANGE = env.get_port_range("NPU_ENGINE_PORTS", (8100, 8999))
# Engine flags and variables that only an admin may set (workers/engine_settings.py,
# PRIVILEGED_FLAGS / PRIVILEGED_ENV) which operators may set too on this console: comma lists
# of names, e.g. NPU_OPERATOR_ALLOWED_FLAGS=--chat-template (docs/security.md).
NPU_OPERATOR_ALLOWED_FLAGS = env.get_list("NPU_OPERATOR_ALLOWED_FLAGS", [])
NPU_OPERATOR_ALLOWED_ENV = env.get_list("NPU_OPERATOR_ALLOWED_ENV", [])
# The password of the `npc-bootstrap` user, which agents use before they are enrolled.
NPU_BOOTSTRAP_REDIS_PASSWORD = env.get_str("NPU_BOOTSTRAP_REDIS_PASSWORD") or ""
if REDIS_MANAGE_ACL and not NPU_BOOTSTRAP_REDIS_PASSWORD:
    raise env.EnvError(
        "NPU_BOOTSTRAP_REDIS_PASSWORD: required when REDIS_MANAGE_ACL is on "
        "(the password of the npc-bootstrap Redis user)"
    )
CELERY_BEAT_SCHEDULE = {
    "mark-offline": {"task": "inventory.mark_offline", "schedule": 5.0},
    "reconcile": {"task": "deployments.reconcile", "schedule": 5.0},
    "autoscale": {"task": "deployments.autoscale", "schedule": 15.0},  # autoscale.PASS_S
    "flush-samples": {"task": "telemetry.flush_samples", "schedule": 5.0},
    "rollup": {"task": "telemetry.rollup", "schedule": 60.0},
    "purge": {"task": "telemetry.purge", "schedule": 3600.0},
    "logs-purge": {"task": "logs.purge", "schedule": 3600.0},
    "benchmarks-sweep": {"task": "benchmarks.sweep", "schedule": 15.0},
    "gateway-usage": {"task": "gateway.flush_usage", "schedule": 30.0},
}

# --- application ----------------------------------------------------------------------------
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "ninja",
    "console.accounts",
    "console.inventory",
    "console.telemetry",
    "console.deployments",
    "console.diagnosis",
    "console.logs",
    "console.benchmarks",
    "console.gateway",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "console.csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "console.accounts.middleware.LoginRequiredMiddleware",
    "console.accounts.middleware.PasswordChangeRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"
ASGI_APPLICATION = "console.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "builtins": ["template_partials.templatetags.partials", "console.ui"],
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.accounts.context_processors.roles",
            ],
        },
    },
]

# ModelBackend with a user's permissions in one query (console/accounts/backends.py)
AUTHENTICATION_BACKENDS = ["console.accounts.backends.ConsoleBackend"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True  # serve straight from static/ without collectstatic

# --- security (tightened when DEBUG is off) -------------------------------------------------
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Content-Security-Policy (console/csp.py; Django 6's SECURE_CSP shape): no inline script or
# style, no eval — templates keep behaviour in static/js and styles in static/css.
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}
# Served over HTTPS (SECURE_COOKIES=1): secure cookies, HSTS, the HTTPS redirect; with these
# `manage.py check --deploy` is clean (tests/security/test_deploy_settings.py). Off by default
# so `make run` works over plain http on 127.0.0.1. See docs/security.md.
if not DEBUG and env.get_bool("SECURE_COOKIES", False):
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = env.get_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env.get_int("SECURE_HSTS_SECONDS", 3600, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.get_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env.get_bool("SECURE_HSTS_PRELOAD", False)
    if not SECURE_HSTS_PRELOAD:
        # Preloading is a commitment the operator makes for the whole domain, not a default.
        SILENCED_SYSTEM_CHECKS = ["security.W021"]
# Trust X-Forwarded-Proto only behind a proxy that sets it (and drops the client's own);
# otherwise any client could claim to be on HTTPS.
if env.get_bool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- console behaviour ----------------------------------------------------------------------
HEARTBEAT_INTERVAL_S = env.get_int("HEARTBEAT_INTERVAL_S", 5, minimum=1)
OFFLINE_AFTER_MISSED_BEATS = 3
# Node addresses: those the agents may report (empty = any), and whether a node's changed
# address applies at once or waits for an admin (console/inventory/services.py).
NODE_ADDRESS_CIDRS = env.get_networks("NODE_ADDRESS_CIDRS")
NODE_ADDRESS_AUTO_ACCEPT = env.get_bool("NODE_ADDRESS_AUTO_ACCEPT", False)
TELEMETRY_RAW_RETENTION_H = env.get_int("TELEMETRY_RAW_RETENTION_H", 24, minimum=1)
TELEMETRY_ROLLUP_RETENTION_D = env.get_int("TELEMETRY_ROLLUP_RETENTION_D", 30, minimum=1)
# 1-minute rollups are 60x the hourly ones (~11.5 M rows a day at 1,000 8-NPU nodes); kept
# for a week, capped by TELEMETRY_ROLLUP_RETENTION_D (docs/telemetry.md)
TELEMETRY_MINUTE_RETENTION_D = env.get_int("TELEMETRY_MINUTE_RETENTION_D", 7, minimum=1)
API_PAGE_SIZE_MAX = 500
NINJA_PAGINATION_MAX_LIMIT = 500
NINJA_PAGINATION_PER_PAGE = 50

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.get_str("LOG_LEVEL", "INFO")},
    # httpx logs every request it sends at INFO: one line per gateway request (and per
    # rollout probe), a formatted write on the request path; their warnings still show
    "loggers": {"httpx": {"level": "WARNING"}, "httpcore": {"level": "WARNING"}},
}
