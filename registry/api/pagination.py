from rest_framework.pagination import PageNumberPagination


class Pagination(PageNumberPagination):
    """``?page=N&page_size=M``; responses carry count, next, previous and results."""

    page_size_query_param = "page_size"
    max_page_size = 500
