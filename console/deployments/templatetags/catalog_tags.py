"""{% catalog_choices as cat %}: the catalog's models and cards for the form's picker."""

from __future__ import annotations

from django import template

from console.deployments.catalog import Catalog, load_catalog

register = template.Library()


@register.simple_tag
def catalog_choices() -> Catalog:
    return load_catalog()
