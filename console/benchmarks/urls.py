from django.urls import path

from console.benchmarks import views

urlpatterns = [
    path("benchmarks/", views.run_list, name="benchmark-list"),
    path("benchmarks/new", views.run_new, name="benchmark-new"),
    path("benchmarks/compare", views.run_compare, name="benchmark-compare"),
    path("benchmarks/<int:run_id>/", views.run_detail, name="benchmark-detail"),
    path("benchmarks/<int:run_id>/cancel", views.run_cancel, name="benchmark-cancel"),
]
