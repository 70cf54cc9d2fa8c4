from django.contrib import admin

from .models import Order, OrderLine, Product


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ("sku", "name", "price", "stock", "fence")
    search_fields = ("sku", "name")
    readonly_fields = ("fence",)


class OrderLineInline(admin.TabularInline):
    model = OrderLine
    extra = 0
    readonly_fields = ("product", "sku", "qty", "price")
    can_delete = False


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("pk", "ref", "status", "strategy", "created_at", "paid_at")
    list_filter = ("status", "strategy")
    search_fields = ("ref",)
    readonly_fields = ("ref", "strategy", "created_at", "paid_at", "cancelled_at")
    inlines = [OrderLineInline]
