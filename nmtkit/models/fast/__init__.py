"""The fast paths: whole alternatives to the reference (:mod:`nmtkit.models.reference`) for the same equations,
each tested against it for values and gradients (``tests/test_reference.py``).

- ``fused``: the recurrences (encoder GRUs, the attentive decoder) with hand-written backward passes;
- ``packed``: the encoder over packed sentences (no work at padding);
- ``output``: the output softmax and its cross-entropy fused with their gradient, in blocks;
- ``matmul``: products shaped and routed for the CPU (oneDNN with reordered weights);
- ``stepweights``: what one search step multiplies, rearranged once per set of weights;
- ``activations``: tanh through the sigmoid, pairwise max;
- ``policy``: the sizes and switches that decide which of these run (:class:`SpeedPolicy`), in one object;
- ``backend``: :class:`FastBackend`, the model's computation composed of these (of the models layer: it is a
  :class:`nmtkit.models.backend.Backend` and reads the models' modules; ``tests/test_layers.py``).

The C kernels these call are below, in :mod:`nmtkit.kernels`.
"""
