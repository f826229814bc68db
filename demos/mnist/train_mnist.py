"""Train an MLP or a CNN classifier on handwritten digits with Synkhronos, data-parallel.

Two data patterns, as the original Synkhronos demos describe:

* ``cpu_data``: the training set lives in ``synk.Data`` (shared memory); every
  step passes the whole set with ``batch=<shuffled indices>`` and each rank
  gathers its own rows.
* ``gpu_data``: the training set is scattered once into shared variables on the
  ranks (GPU memory on GPU workers); every step selects rows with ``batch_s``.

Data: MNIST IDX files from ``--data-dir`` (``train-images-idx3-ubyte`` etc., or
``.gz``); without it, scikit-learn's bundled 8x8 digits (1797 real handwritten
digits, no download).  Validation and test accuracy come from one call each with
``num_slices``.  ``--plot curves.png`` draws the loss and accuracy per epoch.

The first epoch compiles the functions (Synkhronos says so on stderr when that
takes a while); later runs load them from PyTensor's cache.  Status lines go
through ``logging``: ``SYNKHRONOS_LOG_LEVEL=WARNING`` silences them.
"""

import argparse
import gzip
import logging
import os
import struct
import time

import numpy as np
import pytensor
import pytensor.tensor as pt
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

import synkhronos as synk
from synkhronos.extensions import nnet, train, updates

RULES = {name: getattr(updates, name) for name in
         ("sgd", "momentum", "nesterov_momentum", "adagrad", "rmsprop", "adadelta", "adam", "adamax")}


def _read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        _, dtype_code, ndim = struct.unpack(">HBB", f.read(4))
        shape = struct.unpack(">" + "I" * ndim, f.read(4 * ndim))
        if dtype_code != 0x08:
            raise ValueError("%s: only unsigned-byte IDX files are supported" % path)
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(shape)


def _find(data_dir, stem):
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError("no %s(.gz) in %s" % (stem, data_dir))


def load_data(data_dir, seed):
    """(x_train, y_train, x_val, y_val, x_test, y_test, name); x scaled to [0, 1]."""
    if data_dir:
        x = _read_idx(_find(data_dir, "train-images-idx3-ubyte")).reshape(-1, 784) / 255.0
        y = _read_idx(_find(data_dir, "train-labels-idx1-ubyte")).astype(np.int64)
        x_test = _read_idx(_find(data_dir, "t10k-images-idx3-ubyte")).reshape(-1, 784) / 255.0
        y_test = _read_idx(_find(data_dir, "t10k-labels-idx1-ubyte")).astype(np.int64)
        x_train, y_train, x_val, y_val = x[:50000], y[:50000], x[50000:], y[50000:]
        name = "MNIST"
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        order = np.random.default_rng(seed).permutation(len(digits.target))
        x, y = digits.data[order] / 16.0, digits.target[order].astype(np.int64)
        x_train, y_train = x[:1200], y[:1200]
        x_val, y_val, x_test, y_test = x[1200:1500], y[1200:1500], x[1500:], y[1500:]
        name = "scikit-learn digits"
    fx = pytensor.config.floatX
    return [a.astype(fx) if a.dtype.kind == "f" else a for a in
            (x_train, y_train, x_val, y_val, x_test, y_test)] + [name]


def build_mlp(n_in, hidden, n_out, rng):
    """Shared parameters and a function of the input giving class log-probabilities."""
    fx = pytensor.config.floatX
    sizes = [n_in] + hidden + [n_out]
    params = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = rng.standard_normal((a, b)) * np.sqrt(2.0 / a)
        params += [pytensor.shared(w.astype(fx), name="W%d" % i),
                   pytensor.shared(np.zeros(b, fx), name="b%d" % i)]

    def log_probs(x):
        h = x
        for i in range(0, len(params) - 2, 2):
            h = pt.maximum(h.dot(params[i]) + params[i + 1], 0)
        return nnet.log_softmax(h.dot(params[-2]) + params[-1])

    return params, log_probs


def build_cnn(side, n_out, rng):
    """Two conv (3x3, 'same') + ReLU + 2x2 max-pool blocks and a dense layer."""
    fx = pytensor.config.floatX

    def shared(shape, name, scale):
        return pytensor.shared((rng.standard_normal(shape) * scale).astype(fx), name=name, shape=shape)

    w1, w2 = shared((16, 1, 3, 3), "C1", np.sqrt(2 / 9)), shared((32, 16, 3, 3), "C2", np.sqrt(2 / 144))
    flat = 32 * (side // 4) ** 2
    w3 = shared((flat, n_out), "W", np.sqrt(1 / flat))
    b3 = pytensor.shared(np.zeros(n_out, fx), name="b", shape=(n_out,))

    def log_probs(x):
        h = x.reshape((x.shape[0], 1, side, side))
        for w in (w1, w2):
            h = nnet.max_pool2d(pt.maximum(nnet.conv2d(h, w, padding="same"), 0), 2)
        return nnet.log_softmax(h.reshape((h.shape[0], flat)).dot(w3) + b3)

    return [w1, w2, w3, b3], log_probs


def plot_curves(path, history, test_acc, title):
    """Write the loss and accuracy per epoch (``history``: lists by key) to the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    epochs = np.arange(1, len(history["train_loss"]) + 1)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    ax_loss.plot(epochs, history["train_loss"], "o-", ms=3, label="train (mean over the epoch's steps)")
    ax_loss.set(title="Loss (cross-entropy)", xlabel="epoch", ylabel="loss", yscale="log")
    ax_acc.plot(epochs, history["train_acc"], "o-", ms=3, label="train (end of epoch)")
    ax_acc.plot(epochs, history["val_acc"], "s-", ms=3, label="validation")
    ax_acc.axhline(test_acc, color="k", ls="--", lw=1, label="test, after training: %.4f" % test_acc)
    ax_acc.set(title="Accuracy", xlabel="epoch", ylabel="fraction correct")
    for ax in (ax_loss, ax_acc):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(title)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None,
                   help="directory with MNIST IDX files (default: scikit-learn's digits)")
    p.add_argument("--pattern", choices=["cpu_data", "gpu_data"], default="cpu_data")
    p.add_argument("--n", type=int, default=None, help="number of ranks (default: all)")
    p.add_argument("--gpu", action="store_true", help="use GPU workers")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64, help="rows per step over all ranks")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--hidden", default="256,256", help="MLP hidden layer sizes")
    p.add_argument("--rule", choices=sorted(RULES), default="adam")
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--floatx", choices=["float32", "float64"], default="float32",
                   help="PyTensor's floatX for the model and data (default float32)")
    p.add_argument("--plot", metavar="PNG", default=None,
                   help="write the loss and accuracy curves to this PNG file (needs matplotlib)")
    args = p.parse_args(argv)
    if args.plot:  # fail now, not after training
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib: pip install matplotlib")

    pytensor.config.floatX = args.floatx  # before building any variable
    n = synk.fork(args.n, use_gpu=args.gpu)
    rng = np.random.default_rng(args.seed)
    x_tr, y_tr, x_va, y_va, x_te, y_te, name = load_data(args.data_dir, args.seed)
    n_classes = 10
    onehot = np.eye(n_classes, dtype=pytensor.config.floatX)
    if args.model == "cnn":
        params, log_probs = build_cnn(int(round(np.sqrt(x_tr.shape[1]))), n_classes, rng)
    else:
        params, log_probs = build_mlp(x_tr.shape[1], [int(h) for h in args.hidden.split(",")], n_classes, rng)

    x, y = pt.matrix("x"), pt.matrix("y")
    if args.pattern == "cpu_data":
        step = train.make_train_step([x, y], -(y * log_probs(x)).sum(axis=1).mean(), params,
                                     rule=RULES[args.rule], learning_rate=args.learning_rate)
    else:
        sx = pytensor.shared(x_tr[:1], name="x_train")
        sy = pytensor.shared(onehot[y_tr[:1]], name="y_train")
        step = train.make_train_step([], -(sy * log_probs(sx)).sum(axis=1).mean(), params,
                                     rule=RULES[args.rule], learning_rate=args.learning_rate,
                                     sliceable_shareds=[sx, sy])
    correct = pt.eq(log_probs(x).argmax(axis=1), y.argmax(axis=1)).mean()
    accuracy = synk.function([x, y], outputs=correct, name="accuracy")  # "avg" weighs ranks by rows: exact
    synk.distribute()

    d_va = (synk.data(x_va), synk.data(onehot[y_va]))
    d_te = (synk.data(x_te), synk.data(onehot[y_te]))
    d_x, d_y = synk.data(x_tr), synk.data(onehot[y_tr])  # gpu_data: for the training accuracy only
    if args.pattern == "gpu_data":
        synk.scatter([sx, sy], [x_tr, onehot[y_tr]])  # once; each rank keeps its part
        local = synk.get_lengths(sx)
    steps_per_epoch = max(1, len(x_tr) // args.batch_size)
    print("%s: %d train / %d val / %d test rows, %d ranks, %s, pattern %s, rule %s"
          % (name, len(x_tr), len(x_va), len(x_te), n, args.model, args.pattern, args.rule))
    t0 = time.time()
    history = {"train_loss": [], "train_acc": [], "val_acc": []}
    step_times = []  # the time of each training step after the first epoch's (which may compile)
    # Synkhronos' messages (the first epoch compiles) print above the bar instead of through it.
    with logging_redirect_tqdm(loggers=[logging.getLogger("synkhronos")]):
        bar = tqdm(range(args.epochs), desc="epochs", unit="epoch")
        for _ in bar:
            losses = []
            order = rng.permutation(len(x_tr))
            for s in range(steps_per_epoch):
                t_step = time.perf_counter()
                if args.pattern == "cpu_data":
                    idx = order[s * args.batch_size:(s + 1) * args.batch_size]
                    losses.append(float(step(d_x, d_y, batch=idx)))
                else:  # each rank draws its share of the batch from its own rows
                    per_rank = max(1, args.batch_size // n)
                    losses.append(float(step(batch_s=[rng.integers(0, m, per_rank) for m in local])))
                if history["val_acc"]:
                    step_times.append(time.perf_counter() - t_step)
            val = float(accuracy(*d_va, num_slices=2))
            history["train_loss"].append(float(np.mean(losses)))
            history["val_acc"].append(val)
            if args.plot:
                history["train_acc"].append(float(accuracy(d_x, d_y, num_slices=2)))
            bar.set_postfix(loss="%.4f" % np.mean(losses), val_acc="%.4f" % val)
    test = float(accuracy(*d_te, num_slices=2))
    print("Summary: %s %s, %d epochs in %.1f s on %d ranks: validation accuracy %.4f, test accuracy %.4f%s"
          % (name, args.model, args.epochs, time.time() - t0, n, val, test,
             "; median step %.2f ms" % (1e3 * np.median(step_times)) if step_times else ""))
    synk.close()
    if args.plot:
        plot_curves(args.plot, history, test, "%s, %s, pattern %s, %s, %d ranks" % (name, args.model.upper(),
                                                                            args.pattern, args.rule, n))
        print("Curves written to %s" % args.plot)
    return test


if __name__ == "__main__":
    main()
