from deploy.cli.main import entrypoint

entrypoint()
