"""The neural codec parts (SEANet, the iSTFT decoder) and their GAN training (`rvqlm train-codec`)."""
