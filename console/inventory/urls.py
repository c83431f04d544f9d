from django.urls import path

from console.inventory import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("nodes/", views.node_list, name="node-list"),
    path("nodes/<slug:name>/", views.node_detail, name="node-detail"),
    path("nodes/<slug:name>/state", views.node_state, name="node-state"),
    path("nodes/<slug:name>/labels", views.node_labels, name="node-labels"),
    path("nodes/<slug:name>/address", views.node_address_accept, name="node-address-accept"),
    path(
        "nodes/<slug:name>/credentials/rotate",
        views.node_credential_rotate,
        name="node-credential-rotate",
    ),
    path(
        "nodes/<slug:name>/credentials/revoke",
        views.node_credential_revoke,
        name="node-credential-revoke",
    ),
    path("nodes/<slug:name>/reenroll", views.node_reenroll, name="node-reenroll"),
    path(
        "accelerators/<int:accelerator_id>/isolation",
        views.accelerator_isolation,
        name="accelerator-isolation",
    ),
    path("nodes/<slug:name>/checks", views.node_checks, name="node-checks"),
    path("enrollment/", views.enrollment_tokens, name="enrollment"),
    path("enrollment/new", views.enrollment_create, name="enrollment-create"),
    path("enrollment/<int:token_id>/revoke", views.enrollment_revoke, name="enrollment-revoke"),
]
