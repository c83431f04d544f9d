"""The API's list pagination: django-ninja's limit/offset with a bounded offset.

ninja's own `offset` has no upper bound, and an offset past what the database's OFFSET takes
(a 64-bit integer) was a 500; here it is a 422 naming `offset`
(tests/security/test_schemathesis.py found it).
"""

from ninja import Field
from ninja.pagination import LimitOffsetPagination as _NinjaLimitOffsetPagination

MAX_OFFSET = 1_000_000_000


class LimitOffsetPagination(_NinjaLimitOffsetPagination):
    class Input(_NinjaLimitOffsetPagination.Input):
        offset: int = Field(0, ge=0, le=MAX_OFFSET)


PAGE_SIZE = 50  # rows per page on the fleet pages: their cost does not grow with the fleet


def page_of(request, items, per_page: int = PAGE_SIZE, *, count: int | None = None):
    """The `?page=` page of `items` (a queryset or list) for a page view; a bad or too-large
    page number gives the first or last page rather than an error. Two queries on a queryset
    (COUNT and the page's rows), whatever its size; one when the caller knows the `count`."""
    from django.core.paginator import Paginator

    paginator = Paginator(items, per_page)
    if count is not None:
        paginator.count = count  # a cached_property: set, it is not queried
    return paginator.get_page(request.GET.get("page"))
