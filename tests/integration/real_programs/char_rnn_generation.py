"""Character-level text generation with a GRU, written the way the practical-pytorch
char-rnn-generation tutorial (and its many copies) write it: a random 200-character chunk a
step, the model's `forward` called once per character with the hidden state passed in and out,
the losses summed in a Python loop, one Adam step per chunk, and a sample generated now and
then. The text is synthetic (a few phrases in random order) so that it runs anywhere.

    python char_rnn_generation.py [--seconds S] [--mistake]

--mistake plants the classic error: `train()` returns the loss tensor (`loss / chunk_len`) instead
of the number (`loss.item() / chunk_len`), and the loop sums it into `loss_avg` and keeps the
averages in `all_losses` for a plot, so every step's graph stays alive.
"""

import argparse
import math
import random
import string
import time

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--n_epochs", type=int, default=1000000)
parser.add_argument("--print_every", type=int, default=20)
parser.add_argument("--hidden_size", type=int, default=100)
parser.add_argument("--n_layers", type=int, default=1)
parser.add_argument("--learning_rate", type=float, default=0.01)
parser.add_argument("--chunk_len", type=int, default=200)
parser.add_argument("--seconds", type=float, default=600)
parser.add_argument("--mistake", action="store_true")
args = parser.parse_args()

torch.set_num_threads(1)
random.seed(7)
torch.manual_seed(7)

all_characters = string.printable
n_characters = len(all_characters)

PHRASES = ["the quick brown fox jumps over the lazy dog. ",
           "to be, or not to be, that is the question: ",
           "all happy families are alike; each unhappy family is unhappy in its own way. ",
           "it was the best of times, it was the worst of times. ",
           "call me ishmael. "]
file = "".join(random.choice(PHRASES) for _ in range(4000))
file_len = len(file)


def random_chunk():
    start_index = random.randint(0, file_len - args.chunk_len)
    end_index = start_index + args.chunk_len + 1
    return file[start_index:end_index]


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size, n_layers=1):
        super(RNN, self).__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = output_size
        self.n_layers = n_layers

        self.encoder = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size, n_layers)
        self.decoder = nn.Linear(hidden_size, output_size)

    def forward(self, input, hidden):
        input = self.encoder(input.view(1, -1))
        output, hidden = self.gru(input.view(1, 1, -1), hidden)
        output = self.decoder(output.view(1, -1))
        return output, hidden

    def init_hidden(self):
        return torch.zeros(self.n_layers, 1, self.hidden_size)


# Turn string into list of longs
def char_tensor(string):
    tensor = torch.zeros(len(string)).long()
    for c in range(len(string)):
        tensor[c] = all_characters.index(string[c])
    return tensor


def random_training_set():
    chunk = random_chunk()
    inp = char_tensor(chunk[:-1])
    target = char_tensor(chunk[1:])
    return inp, target


def evaluate(prime_str="A", predict_len=100, temperature=0.8):
    with torch.no_grad():
        hidden = decoder.init_hidden()
        prime_input = char_tensor(prime_str)
        predicted = prime_str

        # Use priming string to "build up" hidden state
        for p in range(len(prime_str) - 1):
            _, hidden = decoder(prime_input[p], hidden)
        inp = prime_input[-1]

        for p in range(predict_len):
            output, hidden = decoder(inp, hidden)

            # Sample from the network as a multinomial distribution
            output_dist = output.data.view(-1).div(temperature).exp()
            top_i = torch.multinomial(output_dist, 1)[0]

            # Add predicted character to string and use as next input
            predicted_char = all_characters[top_i]
            predicted += predicted_char
            inp = char_tensor(predicted_char)

    return predicted


def time_since(since):
    s = time.time() - since
    m = math.floor(s / 60)
    s -= m * 60
    return "%dm %ds" % (m, s)


def train(inp, target):
    hidden = decoder.init_hidden()
    decoder.zero_grad()
    loss = 0

    for c in range(args.chunk_len):
        output, hidden = decoder(inp[c], hidden)
        loss += criterion(output, target[c].unsqueeze(0))

    loss.backward()
    decoder_optimizer.step()

    if args.mistake:
        return loss / args.chunk_len
    return loss.item() / args.chunk_len


decoder = RNN(n_characters, args.hidden_size, n_characters, args.n_layers)
decoder_optimizer = torch.optim.Adam(decoder.parameters(), lr=args.learning_rate)
criterion = nn.CrossEntropyLoss()

start = time.time()
all_losses = []
loss_avg = 0

print("Training for %d epochs..." % args.n_epochs, flush=True)
for epoch in range(1, args.n_epochs + 1):
    loss = train(*random_training_set())
    loss_avg += loss

    if epoch % args.print_every == 0:
        print("[%s (%d %d%%) %.4f]" % (time_since(start), epoch, epoch / args.n_epochs * 100, loss),
              flush=True)
        print(evaluate("Wh", 100), "\n", flush=True)
        all_losses.append(loss_avg / args.print_every)
        loss_avg = 0
    if time.time() - start > args.seconds:
        break
