"""Where a model repository is served from and what runs it in production: ``locations`` a local
folder or an object-store URL, in the form tritonserver takes it, and ``deploy_files`` the
container images, Kubernetes manifests and KServe ``InferenceService`` of ``deploy/``.
(``bundling`` packs a repository for servers whose Python lacks this library.)
"""
