"""HTTP plumbing below the retrieval and agent layers: :mod:`kunlunlab.http.client` (how every client retries and
fails) and :mod:`kunlunlab.http.server` (the shell both servers build on). Nothing is imported here, so a client
never loads the server's web framework."""
