"""A physics-informed neural network (PINN) for the viscous Burgers' equation, written the way the
PyTorch ports of Raissi's PINNs write it: a `PhysicsInformedNN` class holding the data and a
`DNN`, the PDE residual from `torch.autograd.grad(..., create_graph=True)`, and training by
LBFGS with `max_iter=50000` and a strong-Wolfe line search driven by the class's `loss_func`
closure, so that ONE `optimizer.step()` call runs for minutes (the closure prints every 100
iterations). Synthetic initial and boundary data, sized for a CPU.

    python pinn_burgers.py [--seconds S] [--mistake]

--mistake plants the classic error: the closure keeps its loss for a plot as a tensor
(`self.loss_history.append(loss)`), so every iteration's graph (the double-backward graph of
the residual) stays alive.
"""

import argparse
import time
from collections import OrderedDict

import numpy as np
import torch

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, default=600)
parser.add_argument("--mistake", action="store_true")
args = parser.parse_args()

torch.set_num_threads(1)
np.random.seed(1234)
torch.manual_seed(1234)

device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class DNN(torch.nn.Module):
    def __init__(self, layers):
        super(DNN, self).__init__()
        self.depth = len(layers) - 1
        self.activation = torch.nn.Tanh

        layer_list = list()
        for i in range(self.depth - 1):
            layer_list.append(("layer_%d" % i, torch.nn.Linear(layers[i], layers[i + 1])))
            layer_list.append(("activation_%d" % i, self.activation()))
        layer_list.append(("layer_%d" % (self.depth - 1), torch.nn.Linear(layers[-2], layers[-1])))
        layerDict = OrderedDict(layer_list)
        self.layers = torch.nn.Sequential(layerDict)

    def forward(self, x):
        out = self.layers(x)
        return out


class PhysicsInformedNN():
    def __init__(self, X_u, u, X_f, layers, lb, ub, nu):
        self.lb = torch.tensor(lb).float().to(device)
        self.ub = torch.tensor(ub).float().to(device)

        self.x_u = torch.tensor(X_u[:, 0:1], requires_grad=True).float().to(device)
        self.t_u = torch.tensor(X_u[:, 1:2], requires_grad=True).float().to(device)
        self.x_f = torch.tensor(X_f[:, 0:1], requires_grad=True).float().to(device)
        self.t_f = torch.tensor(X_f[:, 1:2], requires_grad=True).float().to(device)
        self.u = torch.tensor(u).float().to(device)

        self.layers = layers
        self.nu = nu
        self.dnn = DNN(layers).to(device)

        self.optimizer = torch.optim.LBFGS(
            self.dnn.parameters(),
            lr=1.0,
            max_iter=50000,
            max_eval=50000,
            history_size=50,
            tolerance_grad=1e-5,
            tolerance_change=1.0 * np.finfo(float).eps,
            line_search_fn="strong_wolfe",
        )
        self.iter = 0
        self.loss_history = []

    def net_u(self, x, t):
        u = self.dnn(torch.cat([x, t], dim=1))
        return u

    def net_f(self, x, t):
        """ The pytorch autograd version of calculating residual """
        u = self.net_u(x, t)
        u_t = torch.autograd.grad(u, t, grad_outputs=torch.ones_like(u),
                                  retain_graph=True, create_graph=True)[0]
        u_x = torch.autograd.grad(u, x, grad_outputs=torch.ones_like(u),
                                  retain_graph=True, create_graph=True)[0]
        u_xx = torch.autograd.grad(u_x, x, grad_outputs=torch.ones_like(u_x),
                                   retain_graph=True, create_graph=True)[0]
        f = u_t + u * u_x - self.nu * u_xx
        return f

    def loss_func(self):
        self.optimizer.zero_grad()

        u_pred = self.net_u(self.x_u, self.t_u)
        f_pred = self.net_f(self.x_f, self.t_f)
        loss_u = torch.mean((self.u - u_pred) ** 2)
        loss_f = torch.mean(f_pred ** 2)

        loss = loss_u + loss_f

        loss.backward()
        if args.mistake:
            self.loss_history.append(loss)
        else:
            self.loss_history.append(loss.item())
        self.iter += 1
        if self.iter % 100 == 0:
            print("Iter %d, Loss: %.5e, Loss_u: %.5e, Loss_f: %.5e"
                  % (self.iter, loss.item(), loss_u.item(), loss_f.item()), flush=True)
        return loss

    def train(self):
        self.dnn.train()
        # Backward and optimize
        self.optimizer.step(self.loss_func)

    def predict(self, X):
        x = torch.tensor(X[:, 0:1], requires_grad=True).float().to(device)
        t = torch.tensor(X[:, 1:2], requires_grad=True).float().to(device)
        self.dnn.eval()
        u = self.net_u(x, t)
        f = self.net_f(x, t)
        u = u.detach().cpu().numpy()
        f = f.detach().cpu().numpy()
        return u, f


nu = 0.01 / np.pi
N_u = 100
N_f = 2000
layers = [2, 20, 20, 20, 20, 20, 20, 1]

# the initial condition u(x, 0) = -sin(pi x) and the walls u(-1, t) = u(1, t) = 0, as the
# Burgers' data set holds them; collocation points by uniform sampling (Raissi uses LHS)
lb = np.array([-1.0, 0.0])
ub = np.array([1.0, 1.0])
x0 = np.random.uniform(-1, 1, (N_u // 2, 1))
X_u_ic = np.hstack([x0, np.zeros_like(x0)])
u_ic = -np.sin(np.pi * x0)
tb = np.random.uniform(0, 1, (N_u // 2, 1))
walls = np.where(np.random.rand(N_u // 2, 1) < 0.5, -1.0, 1.0)
X_u_bc = np.hstack([walls, tb])
u_bc = np.zeros_like(tb)
X_u_train = np.vstack([X_u_ic, X_u_bc])
u_train = np.vstack([u_ic, u_bc])
X_f_train = lb + (ub - lb) * np.random.rand(N_f, 2)
X_f_train = np.vstack((X_f_train, X_u_train))

model = PhysicsInformedNN(X_u_train, u_train, X_f_train, layers, lb, ub, nu)

deadline = time.time() + args.seconds
print("Training...", flush=True)
while time.time() < deadline:
    model.train()
    print("LBFGS converged after %d iterations" % model.iter, flush=True)
    u_pred, f_pred = model.predict(X_u_train)
    print("Error u: %e" % np.linalg.norm(u_train - u_pred, 2), flush=True)
