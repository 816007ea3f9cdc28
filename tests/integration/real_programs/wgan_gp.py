"""WGAN with gradient penalty, written the way the PyTorch-GAN collection writes its scripts:
options by argparse, fully connected Generator and Discriminator, `Tensor = torch.FloatTensor`,
`Variable`, the penalty from `autograd.grad(..., create_graph=True)`, the critic trained every
batch and the generator every `n_critic` batches (two Adam optimizers that step at different
rates), a module-level loop over a DataLoader with the default `num_workers`. The images are
synthetic (bars at random places) so that it runs anywhere. Each log line (every 50 batches)
adds the seconds spent waiting for the DataLoader and those of all batches since the last line
(the ImageNet example's Data/Time meters): the loader's share measured with no tool attached.

    python wgan_gp.py [--seconds S] [--mistake]

--mistake plants the classic error: `optimizer_D.zero_grad()` was lost when the loop was
reorganised, so the critic's gradients accumulate over every batch.
"""

import argparse
import time

import numpy as np
import torch
import torch.autograd as autograd
import torch.nn as nn
from torch.autograd import Variable
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--n_epochs", type=int, default=200, help="number of epochs of training")
parser.add_argument("--batch_size", type=int, default=64, help="size of the batches")
parser.add_argument("--lr", type=float, default=0.0002, help="adam: learning rate")
parser.add_argument("--b1", type=float, default=0.5, help="adam: decay of first order momentum of gradient")
parser.add_argument("--b2", type=float, default=0.999, help="adam: decay of first order momentum of gradient")
parser.add_argument("--latent_dim", type=int, default=32, help="dimensionality of the latent space")
parser.add_argument("--img_size", type=int, default=16, help="size of each image dimension")
parser.add_argument("--channels", type=int, default=1, help="number of image channels")
parser.add_argument("--n_critic", type=int, default=5, help="number of training steps for discriminator per iter")
parser.add_argument("--sample_interval", type=int, default=400, help="interval betwen image samples")
parser.add_argument("--seconds", type=float, default=600)
parser.add_argument("--mistake", action="store_true")
opt = parser.parse_args()
print(opt, flush=True)

torch.set_num_threads(1)
torch.manual_seed(0)
np.random.seed(0)

img_shape = (opt.channels, opt.img_size, opt.img_size)

cuda = True if torch.cuda.is_available() else False


class Generator(nn.Module):
    def __init__(self):
        super(Generator, self).__init__()

        def block(in_feat, out_feat, normalize=True):
            layers = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(opt.latent_dim, 64, normalize=False),
            *block(64, 128),
            *block(128, 256),
            nn.Linear(256, int(np.prod(img_shape))),
            nn.Tanh()
        )

    def forward(self, z):
        img = self.model(z)
        img = img.view(img.shape[0], *img_shape)
        return img


class Discriminator(nn.Module):
    def __init__(self):
        super(Discriminator, self).__init__()

        self.model = nn.Sequential(
            nn.Linear(int(np.prod(img_shape)), 256),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(256, 128),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(128, 1),
        )

    def forward(self, img):
        img_flat = img.view(img.shape[0], -1)
        validity = self.model(img_flat)
        return validity


class Bars(Dataset):
    """A vertical or a horizontal bar at a random place, in [-1, 1] like Normalize([0.5], [0.5])."""

    def __len__(self):
        return 6400

    def __getitem__(self, index):
        rng = np.random.RandomState(index)
        img = np.full(img_shape, -1.0, dtype=np.float32)
        k = rng.randint(2, opt.img_size - 2)
        if rng.rand() < 0.5:
            img[:, :, k - 1:k + 1] = 1.0
        else:
            img[:, k - 1:k + 1, :] = 1.0
        return torch.from_numpy(img), 0


# Loss weight for gradient penalty
lambda_gp = 10

# Initialize generator and discriminator
generator = Generator()
discriminator = Discriminator()

if cuda:
    generator.cuda()
    discriminator.cuda()

dataloader = DataLoader(Bars(), batch_size=opt.batch_size, shuffle=True)

# Optimizers
optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))

Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor


def compute_gradient_penalty(D, real_samples, fake_samples):
    """Calculates the gradient penalty loss for WGAN GP"""
    # Random weight term for interpolation between real and fake samples
    alpha = Tensor(np.random.random((real_samples.size(0), 1, 1, 1)))
    # Get random interpolation between real and fake samples
    interpolates = (alpha * real_samples + ((1 - alpha) * fake_samples)).requires_grad_(True)
    d_interpolates = D(interpolates)
    fake = Variable(Tensor(real_samples.shape[0], 1).fill_(1.0), requires_grad=False)
    # Get gradient w.r.t. interpolates
    gradients = autograd.grad(
        outputs=d_interpolates,
        inputs=interpolates,
        grad_outputs=fake,
        create_graph=True,
        retain_graph=True,
        only_inputs=True,
    )[0]
    gradients = gradients.view(gradients.size(0), -1)
    gradient_penalty = ((gradients.norm(2, dim=1) - 1) ** 2).mean()
    return gradient_penalty


# ----------
#  Training
# ----------

start = time.time()
batches_done = 0
data_time = batch_time = 0.0  # since the last log line, as the ImageNet example's meters
for epoch in range(opt.n_epochs):
    end = time.time()
    for i, (imgs, _) in enumerate(dataloader):
        data_time += time.time() - end

        # Configure input
        real_imgs = Variable(imgs.type(Tensor))

        # ---------------------
        #  Train Discriminator
        # ---------------------

        if not opt.mistake:
            optimizer_D.zero_grad()

        # Sample noise as generator input
        z = Variable(Tensor(np.random.normal(0, 1, (imgs.shape[0], opt.latent_dim))))

        # Generate a batch of images
        fake_imgs = generator(z)

        # Real images
        real_validity = discriminator(real_imgs)
        # Fake images
        fake_validity = discriminator(fake_imgs)
        # Gradient penalty
        gradient_penalty = compute_gradient_penalty(discriminator, real_imgs.data, fake_imgs.data)
        # Adversarial loss
        d_loss = -torch.mean(real_validity) + torch.mean(fake_validity) + lambda_gp * gradient_penalty

        d_loss.backward()
        optimizer_D.step()

        optimizer_G.zero_grad()

        # Train the generator every n_critic steps
        if i % opt.n_critic == 0:

            # -----------------
            #  Train Generator
            # -----------------

            # Generate a batch of images
            fake_imgs = generator(z)
            # Loss measures generator's ability to fool the discriminator
            # Train on fake images
            fake_validity = discriminator(fake_imgs)
            g_loss = -torch.mean(fake_validity)

            g_loss.backward()
            optimizer_G.step()

            if batches_done % 50 == 0:
                print(
                    "[Epoch %d/%d] [Batch %d/%d] [D loss: %f] [G loss: %f]\tData %.3f\tTime %.3f"
                    % (epoch, opt.n_epochs, i, len(dataloader), d_loss.item(), g_loss.item(),
                       data_time, batch_time),
                    flush=True,
                )
                data_time = batch_time = 0.0

            if batches_done % opt.sample_interval == 0:
                with torch.no_grad():
                    samples = generator(Variable(Tensor(np.random.normal(0, 1, (25, opt.latent_dim)))))
                print("sampled %d images, mean %.3f" % (samples.size(0), samples.mean().item()), flush=True)

            batches_done += opt.n_critic
        batch_time += time.time() - end
        end = time.time()
        if time.time() - start > opt.seconds:
            break
    if time.time() - start > opt.seconds:
        break
