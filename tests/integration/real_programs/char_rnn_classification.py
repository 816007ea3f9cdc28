"""NLP From Scratch: classifying names with a character-level RNN, written the way the PyTorch
tutorial writes it: a hand-made RNN cell (i2h, i2o on the concatenated input and hidden), one
name at a time fed a character per forward call, NLLLoss, and a hand-written SGD update
(`p.data.add_(p.grad.data, alpha=-learning_rate)`): no optimizer object. The tutorial's data are
names of 18 languages (a download); here each "language" spells its names from its own letters.

--mistake: `rnn.zero_grad()` forgotten in train(): every name's gradient adds to all earlier ones.
"""
import argparse
import math
import random
import string
import time

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument('--seconds', type=float, default=600.0, help='stop after this long')
parser.add_argument('--mistake', action='store_true', help='forget rnn.zero_grad()')
args = parser.parse_args()

all_letters = string.ascii_letters + " .,;'"
n_letters = len(all_letters)

random.seed(0)
torch.manual_seed(0)
all_categories = ['Arabic', 'Chinese', 'Czech', 'Dutch', 'English', 'French', 'German', 'Greek',
                  'Irish', 'Italian', 'Japanese', 'Korean', 'Polish', 'Portuguese', 'Russian',
                  'Scottish', 'Spanish', 'Vietnamese']
n_categories = len(all_categories)


def make_names(seed):
    rng = random.Random(seed)
    letters = rng.sample(string.ascii_lowercase, 9)
    names = []
    for _ in range(200):
        n = rng.randint(3, 10)
        names.append(rng.choice(string.ascii_uppercase) + ''.join(rng.choice(letters) for _ in range(n)))
    return names


category_lines = {c: make_names(i) for i, c in enumerate(all_categories)}


# Find letter index from all_letters, e.g. "a" = 0
def letterToIndex(letter):
    return all_letters.find(letter)


# Turn a line into a <line_length x 1 x n_letters>,
# or an array of one-hot letter vectors
def lineToTensor(line):
    tensor = torch.zeros(len(line), 1, n_letters)
    for li, letter in enumerate(line):
        tensor[li][0][letterToIndex(letter)] = 1
    return tensor


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(RNN, self).__init__()

        self.hidden_size = hidden_size

        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
        self.i2o = nn.Linear(input_size + hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        combined = torch.cat((input, hidden), 1)
        hidden = self.i2h(combined)
        output = self.i2o(combined)
        output = self.softmax(output)
        return output, hidden

    def initHidden(self):
        return torch.zeros(1, self.hidden_size)


n_hidden = 128
rnn = RNN(n_letters, n_hidden, n_categories)


def categoryFromOutput(output):
    top_n, top_i = output.topk(1)
    category_i = top_i[0].item()
    return all_categories[category_i], category_i


def randomChoice(items):
    return items[random.randint(0, len(items) - 1)]


def randomTrainingExample():
    category = randomChoice(all_categories)
    line = randomChoice(category_lines[category])
    category_tensor = torch.tensor([all_categories.index(category)], dtype=torch.long)
    line_tensor = lineToTensor(line)
    return category, line, category_tensor, line_tensor


criterion = nn.NLLLoss()
learning_rate = 0.005  # If you set this too high, it might explode. If too low, it might not learn


def train(category_tensor, line_tensor):
    hidden = rnn.initHidden()

    if not args.mistake:
        rnn.zero_grad()

    for i in range(line_tensor.size()[0]):
        output, hidden = rnn(line_tensor[i], hidden)

    loss = criterion(output, category_tensor)
    loss.backward()

    # Add parameters' gradients to their values, multiplied by learning rate
    for p in rnn.parameters():
        p.data.add_(p.grad.data, alpha=-learning_rate)

    return output, loss.item()


def timeSince(since):
    now = time.time()
    s = now - since
    m = math.floor(s / 60)
    s -= m * 60
    return '%dm %ds' % (m, s)


n_iters = 10000000
print_every = 500
plot_every = 100

# Keep track of losses for plotting
current_loss = 0
all_losses = []

start = time.time()
deadline = time.monotonic() + args.seconds

for iter in range(1, n_iters + 1):
    category, line, category_tensor, line_tensor = randomTrainingExample()
    output, loss = train(category_tensor, line_tensor)
    current_loss += loss

    # Print ``iter`` number, loss, name and guess
    if iter % print_every == 0:
        guess, guess_i = categoryFromOutput(output)
        correct = '✓' if guess == category else '✗ (%s)' % category
        print('%d %d%% (%s) %.4f %s / %s %s' % (iter, iter / n_iters * 100, timeSince(start), loss, line, guess, correct), flush=True)

    # Add current loss avg to list of losses
    if iter % plot_every == 0:
        all_losses.append(current_loss / plot_every)
        current_loss = 0

    if time.monotonic() > deadline:
        break
