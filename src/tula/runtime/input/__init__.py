"""The input: the datasets (built-in and image folders), decoding, the DataLoaders and each
epoch's order, and the device feed."""
