from django.urls import path

from console.diagnosis import webhook_views as views

urlpatterns = [
    path("incidents/webhooks/", views.webhook_list, name="webhook-list"),
    path("incidents/webhooks/new", views.webhook_create, name="webhook-create"),
    path("incidents/webhooks/<int:webhook_id>/edit", views.webhook_edit, name="webhook-edit"),
    path("incidents/webhooks/<int:webhook_id>/toggle", views.webhook_toggle, name="webhook-toggle"),
    path("incidents/webhooks/<int:webhook_id>/delete", views.webhook_delete, name="webhook-delete"),
    path("incidents/webhooks/<int:webhook_id>/test", views.webhook_test, name="webhook-test"),
]
