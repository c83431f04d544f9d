"""Settings for the scale benches: the console's own, plus one trivial view to compare with.

Used only by bench/page_latency.py (DJANGO_SETTINGS_MODULE=bench.scale_settings).
"""

from console.settings import *  # noqa: F403

ROOT_URLCONF = "bench.scale_urls"
