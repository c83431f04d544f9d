from django.urls import path

from console.deployments import catalog_views, views

urlpatterns = [
    path("deployments/", views.deployment_list, name="deployment-list"),
    path("deployments/new", views.deployment_new, name="deployment-new"),
    path(
        "deployments/new/catalog",
        catalog_views.deployment_from_catalog,
        name="deployment-from-catalog",
    ),
    path("catalog/", catalog_views.catalog_page, name="catalog"),
    path("deployments/validate", views.deployment_validate, name="deployment-validate"),
    path("deployments/<slug:name>/", views.deployment_detail, name="deployment-detail"),
    path("deployments/<slug:name>/edit", views.deployment_edit, name="deployment-edit"),
    path("deployments/<slug:name>/try", views.try_prompt, name="deployment-try"),
    path(
        "deployments/<slug:name>/autoscaler",
        views.deployment_autoscaler,
        name="deployment-autoscaler",
    ),
    path(
        "deployments/<slug:name>/replicas/<int:replica_id>/log",
        views.replica_log,
        name="replica-log",
    ),
    path("deployments/<slug:name>/<str:action>", views.deployment_action, name="deployment-action"),
]
