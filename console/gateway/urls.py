from django.urls import path

from console.gateway import views

urlpatterns = [
    path("gateway/", views.gateway, name="gateway"),
    path("gateway/limits/", views.limit_set, name="gateway-limit-set"),
    path("gateway/limits/<int:limit_id>/delete/", views.limit_delete, name="gateway-limit-delete"),
]
