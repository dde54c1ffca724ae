"""Fetches PyTorch's own test files, pinned to one source release, for running them on accel.

The files come from Debian's `pytorch` source package 2.6.0+dfsg-7 (its orig tarball, whose
sha256 the signed .dsc lists). Only the files in FILES and SUPPORT are extracted, each checked
against its own pinned sha256, so a second run with the files in place does nothing and needs no
network.

    python test/pytorch_suites/fetch.py TARGET_DIR [--cache-dir DIR]

The tarball is kept in --cache-dir, else $TORCH_ACCEL_PYTORCH_SRC_CACHE, else
~/.cache/torch_accel/pytorch-src. Exit status 0 when TARGET_DIR holds every file, verified.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

VERSION = "2.6.0+dfsg-7"
TARBALL = "pytorch_2.6.0+dfsg.orig.tar.xz"
URL = f"http://deb.debian.org/debian/pool/main/p/pytorch/{TARBALL}"
# From Checksums-Sha256 of pytorch_2.6.0+dfsg-7.dsc (27212640 bytes).
TARBALL_SHA256 = "099a9601bc40d67656e75735c44abedb0fbe92d08817852ab7472eebb7e6ddff"
TARBALL_SIZE = 27212640
PREFIX = "pytorch-v2.6.0/test/"

# The test files (path under test/ in the tarball) and their sha256. Besides
# torch.testing._internal, which comes with the installed torch, they import only the SUPPORT
# files from PyTorch's test tree.
FILES: dict[str, str] = {
    "test_torch.py": "790fe2fb308e6531e84e7ee96edeb508503483fde8d1f25def59004da658d2c9",
    "test_view_ops.py": "d66cabc237335a0c79f25e85b4defeefba695fb7e00e0d884720ebd391c6f8d3",
    "test_indexing.py": "9e7abcf122d765803ac8d8f5aa397d845f4fce9fb47ee6485c26a19fdb3fa3d5",
    "test_shape_ops.py": "fb2c33d1e36c12f0ce921786d37a634105617a97b92eabe071e35e0d6cd5980d",
    "test_type_promotion.py": "5ad36927fd071da2dd8e7c10cbe0effbdef67fc5b5fa5be0fbdb0129196a8a2a",
    "test_tensor_creation_ops.py": (
        "37dfe52ce9dcd2deb4fdb42dcab09779ee3815a4b443c5952c0cbe30ee48dd07"
    ),
    "test_sort_and_select.py": "37cb72f7df04e1c8610d434d82eaa5206b0551e02ab001a161485f5922e69def",
    "test_sparse.py": "1feb6540813f68fae93b5738590b3e78d02848cbb8eb59c80ffd9eb4c65918e2",
    "test_sparse_csr.py": "2975fc0af5d6d47149582d24ce345309a7f050926bea70cc74b25db430b45387",
    "test_scatter_gather_ops.py": (
        "b412e81dd08b8709a2facd6e67788af9d35527a082f2abf8e2fb906791b76552"
    ),
    "test_segment_reductions.py": (
        "84ec11983fcf6a70a10e849b50e78c36368f04ae4b7d28d8c33f71474a18f883"
    ),
    "nn/test_embedding.py": "d4f12f64236d97299cd0baec34b017ebee633e6fba747bf60e8be863f2160c4e",
    "nn/test_dropout.py": "54c8d0ff53acca65affe121cdc552bdd2e6d557ee9d18a8460d8fdfced6d4974",
    "test_dlpack.py": "0fb1fa68a03783d8f3f19f75280d08e2ad7070440deee174c9c2736bca584d3c",
    "test_foreach.py": "080d7fe58399449751c13ce8c39c394d6bc0d22bddfbbbaa895c4b7e3374ba8b",
    "test_reductions.py": "2e6de3ca6f2ae7932a6defbd2db9c73cdaf0f68180dbdec77ddae316a0d96236",
    "nn/test_convolution.py": "b9f0551857193638a14ad50811c60665f747d67899c5ec9879fc57c3846b8571",
    "nn/test_pooling.py": "82e43aca4ab47891b92348e9a9b6c9dbfc67cd638361bb5127cd50dba6fe3c0f",
    "test_binary_ufuncs.py": "a8ea8b95a34b189a2a244db0fc08c6b122c2f32d1f3cf60595c6533786c7e0dd",
    "test_unary_ufuncs.py": "b00dbf6f23c0cfd56abf9148709c09729f4e0653e8943f66605c6154eeaf0a8f",
    "test_spectral_ops.py": "56a55d93ba5fc3b5b962b8e82e9088a37d4116bd2c10bd30cc001886d36e8892",
    "test_serialization.py": "bbd2e7c122a0697ea10b83ceefcd25000a8495d02bfb06451efc117456d167a9",
    "test_linalg.py": "9742cc5d602f09b41cd822be33cce687bae9a22928eb70bbb8d73a2e4fa502c6",
    "test_optim.py": "76cf0c7a0a79eb070bbd3fea508b083156dcbaefa68d38914e332c34a4177593",
    "test_autograd.py": "a8daf1cb687dad29cc1633c222465a9faecdf2073e137195a32d6d795db033c1",
    "test_nestedtensor.py": "a5bf6472ef6799eb0a12c0be69397ccebe832e4290b58c9e2bc8db9c56423a26",
    "test_ops_gradients.py": "239061330170a4d05080925b0b8b8344db98b0f5c0dd9dfdbdc72b45a579d2cb",
    "test_masked.py": "d607298019389f7373a88629cdaec38082c577c24e124b1ba50b56d52007d2e8",
    "test_transformers.py": "daafc48f17ed7bcb220d1d124905c0a07b14933d5b9a4f06f29dc73e151599cc",
    "test_prims.py": "fb7782c21eae3cbb395aa2c728a23c50ff8c225e574928f4307534a3fd5c36a9",
    "test_numpy_interop.py": "ed3dd8d49e0848b7e2f2c53483bf631a1ec776a0de7d87da3921839f30726aea",
    "nn/test_parametrization.py": (
        "90c93780b52015593c41a88c325a0d70a911a115305036295b1715c0e9cfe85b"
    ),
    "test_maskedtensor.py": "b551b37cd9e48d27feebfefd4e77ebcd77d6d1ca482fedf273d3582644535aee",
    "test_modules.py": "c234b7624ad2777c5c63e4fc307be268513db26d502f3eaf216ea65055c57416",
    "test_schema_check.py": "b3bd7088b9d09bb2b30e8e4293326acbd250e7537d88450a057e76698adf0735",
    "test_ops_fwd_gradients.py": (
        "71d51bf5bcb03839f923167dfb18f6ce2613f4615918f3a810405c66d09c5719"
    ),
    "test_ops.py": "f8a969a6d2db131417d5663ce2e1e0c3968c71ec8eafd139655ef41cba557c7c",
    "nn/test_multihead_attention.py": (
        "038759a18781369d94eca0c0dd3997e2c15f0840b363a02b4b4f7ee5b4b93d82"
    ),
    "test_nn.py": "c9652508631359eb390d0885a3370b8e0de7b68e915a25e725ff9b61d222f13c",
    "test_native_mha.py": "5467ae1c1ad93f92b4d0b319b77aae87ad51ac00a69246bc1ba426d418aeab23",
    "test_complex.py": "91a3aebab28110a3931774a37ea370ef60d96ab7acb34657451d32aa963afb50",
    "functorch/test_eager_transforms.py": (
        "f0a8cfcff24e1ed0782306868682a1d0831c8e69ca78ab50a9f193775d222d73"
    ),
    "functorch/test_vmap.py": "4aea471f3c67195482c6d9ccb1cd63a70af33dca775cdbe855ae1386453b1f03",
    "test_expanded_weights.py": "b2ccd0a56573ba7d777a658696a5b6035c2474895b18198b56f334fee5bfd29f",
    "test_fake_tensor.py": "ba49e1874656e58333c993dca50b35a68bf256274c4467b18cca77f38cabdbbc",
    "test_decomp.py": "872da78f6acb43f7fe4aa129d9762c502c2d2b7d694ebde351a942a968a2e507",
    "test_content_store.py": "610dd0e93b42b2c8c986dcd625ef19f5d97c83c70a6deb12ee6c8fdcc54ba834",
    "test_legacy_vmap.py": "2b65edcc7a2b9f182a311d2ac9987e2adaefd5d62d5cecda806cc6122c17d53a",
    "test_custom_ops.py": "3a87f0317b4da3ffb754a72f2fe65b796f4d440645ce8c375dc11782024c60ec",
    "test_testing.py": "db0d1071f70d574266b8f43e8003ca236fc042cf9c9c11097a5b1f1c177c14b9",
    "test_python_dispatch.py": "2cc51a9738f65cba7365c49b6c4d1283c10c96a5f316a0e80fee1fcbe323f717",
}
# Modules the test files import (test_optim.py: `from optim.test_optim import ...`), extracted
# with them but not run as files of their own.
SUPPORT: dict[str, str] = {
    "optim/test_lrscheduler.py": "0f3f5585ec476ffa928a9ff64d713548009ea031f1e24af21e5df19f2e443205",
    "optim/test_optim.py": "e2dc9cd5d1418fb30eea7c79220f599630383d4e461a923f59adc8a2e74eed43",
    "optim/test_swa_utils.py": "eada8874686ce77e217df4b00b2e97dcc8f1b14d58ce5f97ba65a8f3edf6084b",
    "autograd/test_complex.py": "97ecebcdc764a752b0964aede4e85b08371e60c0dc7f211dd592f5814fe237fd",
    "autograd/test_functional.py": (
        "c18286cdf06915836501ed05c9dd05c1e1c5442bc71f7de230352a28fc557cef"
    ),
    "autograd/test_logging.py": "b8c134fa6e68f2b7bbc1b7cc715fa7f18b143391c3bf179dc8e15d590e2e6896",
    # functorch's test files import them as top-level modules (pytest puts functorch/ on the path)
    "functorch/common_utils.py": "7c6ca4f68d3c9d93e3aeb6c5ad33aafde070d65e1366a1350b5287ed73a648c2",
    "functorch/functorch_additional_op_db.py": (
        "30931c43c3977c9ba3db7bdd9eb9533240aeb02ce433b611fd397877f63f78ef"
    ),
    # PyTorch's Inductor tests, whose CommonTemplate test/inductor_sweep.py runs over accel
    "inductor/test_torchinductor.py": (
        "5b438e78555865fc8c3c5cc1ebb136d9a2b951c37d8bb41ed400b8618a3f9eb9"
    ),
    # test_custom_ops.py reads it (the expected failures of its opcheck tests)
    "minioptest_failures_dict.json": (
        "10c9c1fded1a168afa5295091416370ab5c7a0fd2b5fb68b24249f86eb52ab8a"
    ),
    # test_transformers.py imports generate_faked_module from it
    "test_cpp_extensions_open_device_registration.py": (
        "5db9efc0218edb67f7b901948323f0086b92dbad60507ba8a534e1067a10f82a"
    ),
}
EXTRACTED: dict[str, str] = {**FILES, **SUPPORT}

CACHE_ENV = "TORCH_ACCEL_PYTORCH_SRC_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "torch_accel" / "pytorch-src"
CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verified(path: Path, sha256: str) -> bool:
    return path.is_file() and sha256_of(path) == sha256


def log(message: str) -> None:
    print(f"fetch.py: {message}", file=sys.stderr)


def download_tarball(cache_dir: Path) -> Path:
    """The tarball in cache_dir, downloaded (atomically) unless a verified copy is there."""
    tarball = cache_dir / TARBALL
    if verified(tarball, TARBALL_SHA256):
        return tarball
    cache_dir.mkdir(parents=True, exist_ok=True)
    log(f"downloading {URL} ({TARBALL_SIZE / 2**20:.1f} MiB)")
    start = time.monotonic()
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=TARBALL + ".", suffix=".part", dir=cache_dir)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(URL, timeout=60) as response:
            while chunk := response.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != TARBALL_SHA256:
            raise RuntimeError(
                f"sha256 mismatch for {URL}: got {digest.hexdigest()}, expected {TARBALL_SHA256}"
            )
        tmp.replace(tarball)
    finally:
        tmp.unlink(missing_ok=True)
    log(f"downloaded in {time.monotonic() - start:.1f} s")
    return tarball


def extract(tarball: Path, target: Path, names: set[str]) -> None:
    """Streams through the tarball once and writes out only the wanted regular files."""
    wanted = {PREFIX + name: name for name in names}
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, mode="r|xz") as archive:
        for member in archive:
            name = wanted.pop(member.name, None)
            if name is None:
                continue
            if not member.isfile():
                raise RuntimeError(f"{member.name} is not a regular file in {TARBALL}")
            source = archive.extractfile(member)
            if source is None:
                raise RuntimeError(f"cannot read {member.name} from {TARBALL}")
            data = source.read()
            if hashlib.sha256(data).hexdigest() != EXTRACTED[name]:
                raise RuntimeError(f"sha256 mismatch for {member.name} in {TARBALL}")
            tmp = target / (name + ".part")
            tmp.parent.mkdir(parents=True, exist_ok=True)  # nn/test_embedding.py
            tmp.write_bytes(data)
            tmp.replace(target / name)
            if not wanted:
                break
    if wanted:
        raise RuntimeError(f"not in {TARBALL}: {', '.join(sorted(wanted))}")


def fetch(target: Path, cache_dir: Path) -> None:
    missing = {name for name, sha256 in EXTRACTED.items() if not verified(target / name, sha256)}
    if not missing:
        log(f"{len(EXTRACTED)} files already in {target} (PyTorch {VERSION})")
        return
    extract(download_tarball(cache_dir), target, missing)
    log(f"extracted {len(missing)} files into {target} (PyTorch {VERSION})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path, help="directory to put the test files in")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE),
        help=f"where the tarball is kept (default: ${CACHE_ENV} or {DEFAULT_CACHE})",
    )
    args = parser.parse_args(argv)
    try:
        fetch(args.target.expanduser(), args.cache_dir.expanduser())
    except (OSError, RuntimeError, tarfile.TarError) as error:
        log(f"error: {error}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
