"""Tools for working on ipybox itself (documentation generators); nothing of ipybox imports them."""
