#!/bin/sh
# Part of the Bento's image build (bentofile.yaml `docker.setup_script`): runs as root, after BentoML has created
# the `bentoml` user and before the image switches to it.
#
# huggingface_hub caches hub downloads in ~/.cache/huggingface, which the image does not otherwise have. Docker
# creates a volume's missing mount point owned by root, so a named volume mounted there (docs/deploy.md) would
# be unwritable for `bentoml` and the first hub download would fail. When the directory exists in the image,
# a fresh named volume takes its owner and mode instead.
set -eu
home="$(getent passwd bentoml | cut -d: -f6)"  # /home/bentoml, as BentoML's `useradd -m` made it
mkdir -p "$home/.cache/huggingface"
chown -R bentoml:bentoml "$home/.cache"
