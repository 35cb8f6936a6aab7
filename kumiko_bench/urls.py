"""The bench's URLs: the admin, whose dashboard the ``dashboard`` scenario asks for."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
