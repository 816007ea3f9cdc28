"""Transfer learning, written the way the PyTorch tutorial "Transfer Learning for Computer
Vision" writes its second part, "ConvNet as fixed feature extractor": a ResNet whose layers are
frozen (`param.requires_grad = False`), a new `fc` for 2 classes, an optimizer over
`model_conv.fc.parameters()` only, a StepLR, and `train_model(model, criterion, optimizer,
scheduler, num_epochs)` running a 'train' and a 'val' phase per epoch in one loop, under
`torch.set_grad_enabled(phase == 'train')`, with DataLoaders of 2 workers and the best weights
kept by `copy.deepcopy(model.state_dict())`. The tutorial downloads a pretrained ResNet-18 and
the ants/bees images; here a small ResNet of the same shape (its "pretrained" weights are just
its initial ones) and synthetic 3x32x32 images of two classes. Every 50 batches (of either
phase) a line adds the seconds spent waiting for the DataLoader and those of all batches since
the last line (the ImageNet example's Data/Time meters): the loader's share measured with no
tool attached.

--mistake: the freezing loop is left out (a common slip when the tutorial's two parts are
merged): the backbone keeps requires_grad, so every backward computes and adds up gradients for
all its weights, which the optimizer (over fc only) neither steps nor zeroes.
"""
import argparse
import copy
import time

import torch
import torch.nn as nn
import torch.optim as optim
from torch.optim import lr_scheduler
from torch.utils.data import DataLoader, Dataset


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), widths=(16, 32, 64, 128), num_classes=1000):
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(widths[0], layers[0])
        self.layer2 = self._make_layer(widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(widths[3], layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3], num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18(weights=None):
    return ResNet()


class AntsBees(Dataset):
    """Two classes of 3x32x32 images (a class's colour blob plus noise); the tutorial's
    RandomResizedCrop/RandomHorizontalFlip become a random shift and flip."""

    def __init__(self, n, train, seed):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        yy, xx = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
        blobs = torch.stack([torch.exp(-((yy - 10) ** 2 + (xx - 22) ** 2) / 40),
                             torch.exp(-((yy - 22) ** 2 + (xx - 10) ** 2) / 40)])
        colour = torch.tensor([[0.9, 0.4, 0.1], [0.2, 0.5, 0.9]])
        self.images = (blobs[self.labels][:, None] * colour[self.labels][:, :, None, None]
                       + 0.3 * torch.rand(n, 3, 32, 32, generator=g))
        self.train = train

    def __getitem__(self, i):
        img = self.images[i]
        if self.train:
            dy, dx = torch.randint(-3, 4, (2,)).tolist()
            img = torch.roll(img, (dy, dx), (1, 2))
            if torch.rand(()) < 0.5:
                img = img.flip(2)
        img = (img - 0.45) / 0.25
        return img, int(self.labels[i])

    def __len__(self):
        return len(self.labels)


def train_model(model, criterion, optimizer, scheduler, num_epochs=25):
    since = time.time()
    best_model_wts = copy.deepcopy(model.state_dict())
    best_acc = 0.0
    batches = 0
    data_time = batch_time = 0.0  # since the last meter line

    for epoch in range(num_epochs):
        print(f'Epoch {epoch}/{num_epochs - 1}', flush=True)
        print('-' * 10, flush=True)

        # Each epoch has a training and validation phase
        for phase in ['train', 'val']:
            if phase == 'train':
                model.train()  # Set model to training mode
            else:
                model.eval()   # Set model to evaluate mode

            running_loss = 0.0
            running_corrects = 0

            # Iterate over data.
            end = time.time()
            for inputs, labels in dataloaders[phase]:
                data_time += time.time() - end
                inputs = inputs.to(device)
                labels = labels.to(device)

                # zero the parameter gradients
                optimizer.zero_grad()

                # forward
                # track history if only in train
                with torch.set_grad_enabled(phase == 'train'):
                    outputs = model(inputs)
                    _, preds = torch.max(outputs, 1)
                    loss = criterion(outputs, labels)

                    # backward + optimize only if in training phase
                    if phase == 'train':
                        loss.backward()
                        optimizer.step()

                # statistics
                running_loss += loss.item() * inputs.size(0)
                running_corrects += torch.sum(preds == labels.data)
                batch_time += time.time() - end
                batches += 1
                if batches % 50 == 0:
                    print(f'[meter] {batches} batches\tData {data_time:.3f}\tTime {batch_time:.3f}',
                          flush=True)
                    data_time = batch_time = 0.0
                end = time.time()
            if phase == 'train':
                scheduler.step()

            epoch_loss = running_loss / dataset_sizes[phase]
            epoch_acc = running_corrects.double() / dataset_sizes[phase]

            print(f'{phase} Loss: {epoch_loss:.4f} Acc: {epoch_acc:.4f}', flush=True)

            # deep copy the model
            if phase == 'val' and epoch_acc > best_acc:
                best_acc = epoch_acc
                best_model_wts = copy.deepcopy(model.state_dict())
            if time.time() > deadline:
                break
        print(flush=True)
        if time.time() > deadline:
            break

    time_elapsed = time.time() - since
    print(f'Training complete in {time_elapsed // 60:.0f}m {time_elapsed % 60:.0f}s')
    print(f'Best val Acc: {best_acc:4f}')

    # load best model weights
    model.load_state_dict(best_model_wts)
    return model


if __name__ == '__main__':
    parser = argparse.ArgumentParser()
    parser.add_argument('--seconds', type=float, default=600.0, help='stop after this long')
    parser.add_argument('--mistake', action='store_true', help='leave the backbone trainable')
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    deadline = time.time() + args.seconds
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

    image_datasets = {'train': AntsBees(2400, True, 0), 'val': AntsBees(600, False, 1)}
    dataloaders = {x: DataLoader(image_datasets[x], batch_size=16, shuffle=True, num_workers=2)
                   for x in ['train', 'val']}
    dataset_sizes = {x: len(image_datasets[x]) for x in ['train', 'val']}

    model_conv = resnet18(weights='IMAGENET1K_V1')
    if not args.mistake:
        for param in model_conv.parameters():
            param.requires_grad = False

    # Parameters of newly constructed modules have requires_grad=True by default
    num_ftrs = model_conv.fc.in_features
    model_conv.fc = nn.Linear(num_ftrs, 2)

    model_conv = model_conv.to(device)

    criterion = nn.CrossEntropyLoss()

    # Observe that only parameters of final layer are being optimized as
    # opposed to before.
    optimizer_conv = optim.SGD(model_conv.fc.parameters(), lr=0.001, momentum=0.9)

    # Decay LR by a factor of 0.1 every 7 epochs
    exp_lr_scheduler = lr_scheduler.StepLR(optimizer_conv, step_size=7, gamma=0.1)

    model_conv = train_model(model_conv, criterion, optimizer_conv, exp_lr_scheduler, num_epochs=25)
