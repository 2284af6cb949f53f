"""A training loop driven from Python: solver.step in chunks, the train loss read from the
net's blob after each, a test pass every few chunks, and the curves drawn to a PNG with
matplotlib where it is installed (python3-matplotlib), as pycaffe's notebooks do.

    kiln data fetch fashion-mnist
    PYTHONPATH=build/python python3 examples/python/train_loop.py [ITERATIONS] [OUT.png]

Trains models/lenet (its solver, from the start) for ITERATIONS (default 1000).
"""
import os
import sys

import numpy as np

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))
SOLVER = os.path.join(HERE, "..", "..", "models", "lenet", "lenet_solver.prototxt")


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    png = sys.argv[2] if len(sys.argv) > 2 else "train_loop.png"
    solver = kiln.get_solver(SOLVER)
    chunk, tests_every = 20, 10
    steps, losses, test_steps, accuracies = [], [], [], []
    test = solver.test_nets[0]
    while solver.iter < iters:
        solver.step(min(chunk, iters - solver.iter))
        steps.append(solver.iter)
        losses.append(float(solver.net.blobs["loss"].data))
        if len(steps) % tests_every == 0 or solver.iter >= iters:
            # 20 batches of the test set through the test net (it reads the train net's
            # weights), as the solver's own test pass would
            acc = np.mean([float(test.forward()["accuracy"]) for _ in range(20)])
            test_steps.append(solver.iter)
            accuracies.append(acc)
            print("iter %5d  loss %.4f  test accuracy %.4f" % (solver.iter, losses[-1], acc))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no %s" % png)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, label="train loss")
    ax.set_xlabel("iteration")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot(test_steps, accuracies, "r.-", label="test accuracy")
    ax2.set_ylabel("accuracy")
    fig.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(png)
    print("wrote %s" % png)


if __name__ == "__main__":
    main()
