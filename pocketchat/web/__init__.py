"""The web side: HTTP routes, the `/ws` socket, sign-in, the pages and the body limit."""
